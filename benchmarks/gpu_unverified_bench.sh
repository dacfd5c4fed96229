#!/usr/bin/env bash
# The second call after benchmarks/gpu_unverified.sh (carry .whl; timeout_s 600): convtune bench of issue 22's
# depthwise layers through the planner (which trips it picks, fused or not; the drop-in's times; each kept-spectra
# trip timed whole side by side with the torch-fft peer: bench_trip_paired, new in the 25th session):
#   bash benchmarks/gpu_unverified_bench.sh
source "$(dirname "$0")/device_part.sh"
part bench-2d 250 python3 -m convtune bench benchmarks/fft_class.yaml --layers replknet-dw31,slak-dw51 \
  --time-budget 2 --db /tmp/unverified.db -o "$O/bench-2d.json"
grep -sE "^(replknet|slak)|fft-trip" "$O/bench-2d.log"
part bench-1d 150 python3 -m convtune bench public-suite --layers hyena-long-dw --time-budget 2 --db /tmp/unverified.db \
  -o "$O/bench-1d.json"
grep -sE "^hyena|fft-trip" "$O/bench-1d.log"
