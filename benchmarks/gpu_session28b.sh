#!/usr/bin/env bash
# The 28th session's second call (carry .whl; timeout_s 600), at the rows' fused first and last passes (fft-row v4,
# round trips v16): long-16k-dw's and hyena-long-dw's block trips side by side with the torch-fft peer, long-16k-dw
# through `convtune bench` (fresh cache; the 27th session's attempt ran out of its 200 s), the GPU tests of the row
# kernels and the round trips.
#   bash benchmarks/gpu_session28b.sh
source "$(dirname "$0")/device_part.sh"
trips trips 200 --layers long-16k-dw,hyena-long-dw --side-by-side 60
gpu_tests tests 200 tests/test_rowconv.py tests/test_roundtrip.py
part bench-long 330 python3 -m convtune bench benchmarks/fft_class.yaml --layers long-16k-dw --db /tmp/l.db \
  -o "$O/bench-long.json"
grep -sE "long-16k-dw |misses" "$O/bench-long.log"
