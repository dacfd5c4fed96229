#!/usr/bin/env bash
# The 26th session's second measuring call (carry .whl; timeout_s 600):
#   bash benchmarks/gpu_session26b.sh
# 1. GPU tests of the rows' and round trips' kernels: the fused backward passes of rows over 8192 points (sums in
#    device memory) and every row kernel after the twiddle index went through an empty asm (fewer spills);
# 2. benchmarks/block_trips.py on long-16k-dw: every block candidate, the fused ones among them;
# 3. convtune bench of fbfft-L2 and dense-k31 with the torch-fft peer in fp32 math (it ran in TF32 before 4472e55),
#    and of long-16k-dw through the planner.
source "$(dirname "$0")/device_part.sh"
gpu_tests tests 200 tests/test_roundtrip.py tests/test_rowconv.py -k "block or trip or fused or kept or row"
trips trips-long 150 --layers long-16k-dw
part bench-dense 150 python3 -m convtune bench public-suite --layers fbfft-L2,dense-k31 --time-budget 2 \
  --db /tmp/dense.db -o "$O/bench-dense.json"
grep -sE "^(fbfft|dense)|fft-trip|misses" "$O/bench-dense.log"
part bench-long 120 python3 -m convtune bench benchmarks/fft_class.yaml --layers long-16k-dw --time-budget 2 \
  --db /tmp/long.db -o "$O/bench-long.json"
grep -sE "^long|fft-trip" "$O/bench-long.log"
