#!/usr/bin/env bash
# The 26th session's last call (carry .whl; timeout_s 600): issue 22's layers through convtune bench after the
# round trips' host-time trims (8032c4d), each kept-spectra trip also timed whole side by side with the torch-fft
# peer; then the GPU tests of the strategies whose products enter gemm_precision (it now sets only what differs).
#   bash benchmarks/gpu_session26d.sh
source "$(dirname "$0")/device_part.sh"
part bench-2d 130 python3 -m convtune bench benchmarks/fft_class.yaml --layers replknet-dw31,slak-dw51 \
  --time-budget 2 --db /tmp/final.db -o "$O/bench-2d.json"
grep -sE "round trip  |misses" "$O/bench-2d.log"
part bench-suite 200 python3 -m convtune bench public-suite --layers hyena-long-dw,dense-k31,fbfft-L2 \
  --time-budget 2 --db /tmp/final.db -o "$O/bench-suite.json"
grep -sE "round trip  |misses" "$O/bench-suite.log"
gpu_tests tests 200 tests/test_strategies.py tests/test_gpu.py tests/test_planner.py tests/test_narrow.py
