#!/usr/bin/env bash
# What the 25th session wrote after its last device call, checked in one device call (carry .whl; timeout_s 600):
#   bash benchmarks/gpu_unverified.sh
# 1. GPU tests of the round trips: every block candidate of three long rows against float64, the rows' fused
#    backward passes (rowfft_bwd_both) among them, and the drop-in's kept-spectra tests;
# 2. benchmarks/block_trips.py on hyena-long-dw (the fused trips beside the others; the best side by side with the
#    torch-fft peer, each twice a turn, so the peer's and the trip's ratios to themselves show the turns' noise), then
#    long-16k-dw (no fused form: its sums do not fit beside the row);
# 3. convtune bench of hyena-long-dw through the planner (which trip it picks, the drop-in's time, and the trip timed
#    whole side by side with the peer: bench_trip_paired, also new).
source "$(dirname "$0")/device_part.sh"
part tests 150 python3 -m pytest -q -p no:cacheprovider -rfE -n 16 -m gpu tests/test_roundtrip.py \
  tests/test_torch_gpu.py -k "block or kept or trip"
grep -sE "[0-9]+ (passed|failed)|^(FAILED|ERROR)" "$O/tests.log" | head -30
part trips-1d 200 python3 benchmarks/block_trips.py --layers hyena-long-dw,long-16k-dw -o "$O/trips-1d.json"
grep -sE "^==" "$O/trips-1d.log"
part bench-1d 140 python3 -m convtune bench public-suite --layers hyena-long-dw --time-budget 2 --db /tmp/unverified.db \
  -o "$O/bench-1d.json"
grep -sE "^hyena|fft-trip" "$O/bench-1d.log"
