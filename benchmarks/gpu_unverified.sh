#!/usr/bin/env bash
# What the 25th session wrote after its last device call, checked in one device call (carry .whl; timeout_s 600):
#   bash benchmarks/gpu_unverified.sh
# 1. GPU tests of the round trips: every block candidate of three long rows and a RepLKNet-sized image against
#    float64, the fused backward passes (rowfft_bwd_both; planefft_bwd_part + planefft_wgrad_sum) among them, and
#    the drop-in's kept-spectra tests;
# 2. benchmarks/block_trips.py on hyena-long-dw and long-16k-dw (the fused trips beside the others; the best side by
#    side with the torch-fft peer, each twice a turn, so the peer's and the trip's ratios to themselves show the
#    turns' noise), then replknet-dw31 and slak-dw51 at their tuned sizes, fused and not.
# Then, in a second call, benchmarks/gpu_unverified_bench.sh: convtune bench through the planner.
source "$(dirname "$0")/device_part.sh"
gpu_tests tests 170 tests/test_roundtrip.py tests/test_torch_gpu.py -k "block or kept or trip"
trips trips-1d 150 --layers hyena-long-dw,long-16k-dw
trips trips-replknet 80 --layers replknet-dw31 --only "sizes=72x72"
trips trips-slak 140 --layers slak-dw51 --only "sizes=81x96"
