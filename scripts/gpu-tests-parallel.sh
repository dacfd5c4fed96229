#!/usr/bin/env bash
# Every GPU test (-m gpu) in under ten minutes on one H100 or H200: the drop-in's CUDA tests and the rest
# run side by side on the one GPU, the rest spread over WORKERS pytest-xdist workers (default 8; pytest-xdist
# comes with scripts/offline-wheels.sh on a machine without network access):
#   bash scripts/gpu-tests-parallel.sh            (TORCH_TESTS=... narrows the drop-in part, e.g. one test)
# Logs go to $LOG_DIR (default /tmp: torch-gpu.log, gpu-rest.log); the summary lines and failures are printed at
# the end, each within LIMIT seconds (default 540).
cd "$(dirname "$0")/.."
[ -d .whl ] && source scripts/offline-env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"
O=${LOG_DIR:-/tmp}
L=${LIMIT:-540}
start=$(date +%s)
timeout "$L" python3 -m pytest -q -p no:cacheprovider -rfE --durations=10 ${TORCH_TESTS:-tests/test_torch_gpu.py} \
  > "$O/torch-gpu.log" 2>&1 &
a=$!
timeout "$L" python3 -m pytest -q -p no:cacheprovider -rfE --durations=25 -n "${WORKERS:-8}" -m gpu tests \
  --ignore tests/test_torch_gpu.py > "$O/gpu-rest.log" 2>&1 &
b=$!
wait $a; ea=$?
wait $b; eb=$?
for n in torch-gpu:$ea gpu-rest:$eb; do
  f=${n%%:*}
  # pytest's summary line
  echo "== $f (exit ${n##*:}, $(( $(date +%s) - start )) s): $(grep -E "[0-9]+ (passed|failed|error)" "$O/$f.log" | tail -1)"
  grep -E "^(FAILED|ERROR)" "$O/$f.log" | head -30
done
