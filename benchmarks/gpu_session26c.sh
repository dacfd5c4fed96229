#!/usr/bin/env bash
# The 26th session's host-time trims of the round trips (carry .whl; timeout_s 600):
#   bash benchmarks/gpu_session26c.sh
# 1. host time of a block trip's call, warm and after the peer (benchmarks/trip_host_profile.py), and the trip timed
#    after the peer with the GPU idle (benchmarks/paired_gap.py);
# 2. GPU tests of everything that reads operands through precision.launch_memory or runs a round trip.
source "$(dirname "$0")/device_part.sh"
part host 100 python3 benchmarks/trip_host_profile.py --layers replknet-dw31,hyena-long-dw
grep -sE "^==" "$O/host.log"
part gap 120 python3 benchmarks/paired_gap.py --layers replknet-dw31,hyena-long-dw,slak-dw51 -o "$O/gap.json"
grep -sE "^\{" "$O/gap.log" | cut -c1-400
gpu_tests tests 330 tests/test_roundtrip.py tests/test_precision.py tests/test_torch_gpu.py tests/test_rowconv.py \
  tests/test_planeconv.py tests/test_fft64.py
