#!/usr/bin/env bash
# The 27th session's fifth call (carry .whl; timeout_s 600): radix-32 passes for rows (32 x 32 x 16 at 16384 points:
# three passes over shared memory, not four or five). long-16k-dw's block trips, each candidate timed, the best side
# by side with the torch-fft peer; the row and round-trip GPU tests; then long-16k-dw through convtune bench.
#   bash benchmarks/gpu_session27e.sh
source "$(dirname "$0")/device_part.sh"
trips trips-long32 150 --layers long-16k-dw --side-by-side 40
gpu_tests tests 200 tests/test_rowconv.py tests/test_roundtrip.py
part bench-1d 200 python3 -m convtune bench benchmarks/fft_class.yaml --layers long-16k-dw \
  --time-budget 2 --db /tmp/r.db -o "$O/bench-1d.json"
grep -sE "round trip  |kept spectra|misses" "$O/bench-1d.log"
