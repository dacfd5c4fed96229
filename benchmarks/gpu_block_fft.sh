#!/usr/bin/env bash
# The one-block FFT strategies (fft-row, fft-plane; issue 22) on the GPU in one device call (carry .whl, see
# scripts/fetch-gpu-wheels.sh): their GPU tests first (every pass, dtype and layout against float64), then
# benchmarks/block_fft.py on issue 22's layers in float32, and in bfloat16 channels_last where time is left.
#   bash benchmarks/gpu_block_fft.sh
# Logs and JSON under $OUT; the summary lines are printed at the end.
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
git rev-parse --short HEAD 2>/dev/null
O=${OUT:-/tmp}
start=$(date +%s)
timeout ${TEST_LIMIT:-240} python3 -m pytest -q -p no:cacheprovider -rfE -m gpu tests/test_rowconv.py \
  tests/test_planeconv.py -x > "$O/block-fft-tests.log" 2>&1
echo "== tests (exit $?, $(( $(date +%s) - start )) s): $(tail -1 "$O/block-fft-tests.log")"
grep -E "^(FAILED|ERROR)|Error" "$O/block-fft-tests.log" | head -20
timeout ${BENCH_LIMIT:-200} python3 benchmarks/block_fft.py -o "$O/block-fft-fp32.json" > "$O/block-fft-fp32.txt" 2>&1
echo "== bench fp32 (exit $?)"; grep -E "^==|copy" "$O/block-fft-fp32.txt"; tail -3 "$O/block-fft-fp32.txt"
timeout ${HALF_LIMIT:-120} python3 benchmarks/block_fft.py --dtype bfloat16 --layout channels_last \
  --layers hyena-long-dw,replknet-dw31,slak-dw51 -o "$O/block-fft-bf16cl.json" > "$O/block-fft-bf16cl.txt" 2>&1
echo "== bench bf16 channels_last (exit $?)"; grep -E "^==" "$O/block-fft-bf16cl.txt"
