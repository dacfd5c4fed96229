#!/usr/bin/env bash
# The 27th session's second call (carry .whl; timeout_s 600): rows loaded by cp.async (float32, unit stride) in the
# one-block row kernels: long-16k-dw's and hyena's block trips timed (each candidate, the best side by side with the
# torch-fft peer), fft-row's GPU tests; then dense-k31 through convtune bench after a7b91b8's host trims.
# The cp.async loads it measured did not pay and were not committed (BENCHMARKS.md, 27th session).
#   bash benchmarks/gpu_session27b.sh
source "$(dirname "$0")/device_part.sh"
trips trips-long 170 --layers long-16k-dw,hyena-long-dw --side-by-side 40
gpu_tests tests 180 tests/test_rowconv.py tests/test_roundtrip.py
part bench-dense 180 python3 -m convtune bench public-suite --layers dense-k31 --time-budget 2 --db /tmp/b.db \
  -o "$O/bench-dense.json"
grep -sE "dense-k31 |misses" "$O/bench-dense.log"
