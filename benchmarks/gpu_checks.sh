#!/usr/bin/env bash
# The GPU tests of the open issues in one device call (carry .whl, see scripts/fetch-gpu-wheels.sh):
#   bash benchmarks/gpu_checks.sh
# the PyTorch drop-in on CUDA tensors (issue 15), every GPU strategy in half precision and channels_last
# (issue 16), the rank-3 cases on the GPU (issue 20), the torch strategy's registry cases. Each part has
# its own time limit and log under $OUT; the summary lines are printed at the end.
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"
git rev-parse --short HEAD 2>/dev/null
O=${OUT:-/tmp}
part() {
  local name=$1 limit=$2; shift 2
  local start=$(date +%s)
  timeout "$limit" python3 -m pytest -q -p no:cacheprovider -rfE "$@" > "$O/$name.log" 2>&1
  echo "== $name (exit $?, $(( $(date +%s) - start )) s): $(tail -1 "$O/$name.log")"
  grep -E "^(FAILED|ERROR)" "$O/$name.log" | head -20
}
part torch-gpu ${TORCH_LIMIT:-240} tests/test_torch_gpu.py
part precision-gpu ${PRECISION_LIMIT:-150} -m gpu tests/test_precision.py
part strategies-3d-torch ${STRATEGIES_LIMIT:-120} -m gpu tests/test_strategies.py -k "3d or torch"
