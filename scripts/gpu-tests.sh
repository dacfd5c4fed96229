#!/usr/bin/env bash
# The whole test suite, GPU tests included, on a machine with an NVIDIA GPU, CuPy and PyTorch:
#   bash scripts/gpu-tests.sh [pytest args]
# Without network access, fetch the wheels first (scripts/offline-wheels.sh); the log goes to $LOG_DIR (default /tmp).
cd "$(dirname "$0")/.."
[ -d .whl ] && source scripts/offline-env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"
set -o pipefail
python3 -m pytest -q -p no:cacheprovider tests "$@" 2>&1 | tee "${LOG_DIR:-/tmp}/gpu-tests.log"
