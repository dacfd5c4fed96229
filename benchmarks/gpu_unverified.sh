#!/usr/bin/env bash
# Everything the 23rd session wrote without a GPU, checked in one device call of under ten minutes (carry .whl; first
# run in the 24th session, whose first call named a test file that does not exist: fixed since):
#   bash benchmarks/gpu_unverified.sh
# 1. the GPU tests of fft-row, fft-plane, the 3-D half-precision depthwise kernels and the opt-in cuBLASLt form;
# 2. benchmarks/block_fft.py on issue 22's layers (float32; each candidate verified, then timed beside the FFT
#    strategy's plans and the torch-fft peer);
# 3. benchmarks/pointwise_host_parts.py (cuBLAS against cuBLASLt host time per 1x1 call);
# 4. the planner's full-batch verification of cuDNN's runtime-compiled plans: a short ResNet-50 AMP tuning, its
#    cuDNN build column (compare with docs/device-logs/2026-11-24-s20-amp-tune-r50-*).
# Logs under $OUT; summaries printed. Each part has its own time limit. HALF_LIMIT=120 adds block_fft.py in
# bfloat16 channels_last on the 31x31, 51x51 and Hyena layers.
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
git rev-parse --short HEAD 2>/dev/null
O=${OUT:-/tmp}
part() {
  local name=$1 limit=$2; shift 2
  local start=$(date +%s)
  timeout "$limit" "$@" > "$O/$name.log" 2>&1
  echo "== $name (exit $?, $(( $(date +%s) - start )) s)"
}
part tests ${TEST_LIMIT:-200} python3 -m pytest -q -p no:cacheprovider -rfE -n 8 -m gpu tests/test_rowconv.py \
  tests/test_planeconv.py tests/test_cublaslt.py tests/test_gpu.py -k "rowconv or planeconv or cublaslt or depthwise"
grep -E "[0-9]+ (passed|failed)|^(FAILED|ERROR)" "$O/tests.log" | head -30
part block-fft ${BENCH_LIMIT:-170} python3 benchmarks/block_fft.py -o "$O/block-fft-fp32.json"
grep -E "^==|copy|Error" "$O/block-fft.log" | head -20
part host-parts ${HOST_LIMIT:-60} python3 benchmarks/pointwise_host_parts.py
grep -E "==|conv2d|ArrayPlan|launch\(|error" "$O/host-parts.log" | head -40
part rtc-tune ${TUNE_LIMIT:-150} python3 -m convtune tune torchvision:resnet50 --batch 32 --dtype bfloat16 \
  --layout channels_last --db "$O/rtc.db"
grep -E "tuned, |^cudnn |^torch |^im2col " "$O/rtc-tune.log"
if [ "${HALF_LIMIT:-0}" -gt 0 ]; then
  part block-fft-bf16cl "$HALF_LIMIT" python3 benchmarks/block_fft.py --dtype bfloat16 --layout channels_last \
    --layers hyena-long-dw,replknet-dw31,slak-dw51 -o "$O/block-fft-bf16cl.json"
  grep -E "^==|Error" "$O/block-fft-bf16cl.log" | head -10
fi
