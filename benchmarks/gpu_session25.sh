#!/usr/bin/env bash
# The 25th session's last device call (carry .whl; timeout_s 600):
#   bash benchmarks/gpu_session25.sh
# 1. GPU tests of the round trips (every block candidate of long rows against float64, 1024-thread blocks included)
#    and the drop-in's kept-spectra tests (fft-row's per-pass kernels are unchanged: their source is the same);
# 2. benchmarks/block_trips.py: hyena-long-dw and long-16k-dw (every candidate, the whole trip, a Chrome trace of
#    three whole trips, the peer side by side), then replknet-dw31 and slak-dw51 at their tuned sizes.
source "$(dirname "$0")/device_part.sh"
gpu_tests tests 150 tests/test_roundtrip.py tests/test_torch_gpu.py -k "block or kept or trip"
trips trips-1d 160 --layers hyena-long-dw,long-16k-dw --trace "$O/traces"
trips trips-replknet 70 --layers replknet-dw31 --only "sizes=72x72,block,radices=16x9]"
trips trips-slak 110 --layers slak-dw51 --only "sizes=81x96"
