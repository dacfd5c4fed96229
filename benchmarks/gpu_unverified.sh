#!/usr/bin/env bash
# What the 24th session changed after its last GPU test run, checked in one device call of under ten minutes
# (carry .whl; the parts' limits add up to 500 s: run it with timeout_s 600; part 3 is off by default, run it alone
# in a second call with TEST_LIMIT=0 BENCH2D_LIMIT=0 BENCH1D_LIMIT=0 BLOCK_LIMIT=150):
#   bash benchmarks/gpu_unverified.sh
# 1. the GPU tests of fft-row and fft-plane (radix-16 and radix-9 candidates, SLaK's 96x96 size, batch slices
#    clamped to the batch), and the planner's;
# 2. convtune bench of issue 22's depthwise layers through the planner, with kept spectra: the block round trips
#    (x's, w's and dy's spectra made once; the filter gradient from the kept spectra, no transform of its own) beside
#    the per-pass plans, whose fft-plane filter gradients can now win (slices clamped to the verification batch);
# 3. benchmarks/block_fft.py on the same layers (every candidate verified against float64, then timed; the best per
#    pass beside the torch-fft peer).
# Logs under $OUT; summaries printed. Each part has its own time limit.
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
O=${OUT:-/tmp}
part() {
  local name=$1 limit=$2; shift 2
  [ "$limit" = 0 ] && return
  local start=$(date +%s)
  timeout "$limit" "$@" > "$O/$name.log" 2>&1
  echo "== $name (exit $?, $(( $(date +%s) - start )) s)"
}
part tests ${TEST_LIMIT:-240} python3 -m pytest -q -p no:cacheprovider -rfE -n 12 -m gpu tests/test_rowconv.py \
  tests/test_planeconv.py tests/test_planner.py tests/test_roundtrip.py tests/test_torch_gpu.py -k \
  "not test_torch_gpu or kept or block or trip"
grep -sE "[0-9]+ (passed|failed)|^(FAILED|ERROR)" "$O/tests.log" | head -30
part bench-2d ${BENCH2D_LIMIT:-160} python3 -m convtune bench benchmarks/fft_class.yaml --layers replknet-dw31,slak-dw51 \
  --time-budget 2 --db /tmp/unverified.db -o "$O/bench-2d.json"
grep -sE "^(replknet|slak)|fft-trip" "$O/bench-2d.log"
part bench-1d ${BENCH1D_LIMIT:-100} python3 -m convtune bench public-suite --layers hyena-long-dw \
  --time-budget 2 --db /tmp/unverified.db -o "$O/bench-1d.json"
grep -sE "^hyena|fft-trip" "$O/bench-1d.log"
part block-fft ${BLOCK_LIMIT:-0} python3 benchmarks/block_fft.py --layers hyena-long-dw,replknet-dw31,slak-dw51 \
  -o "$O/block-fft.json"
grep -sE "^==" "$O/block-fft.log"
