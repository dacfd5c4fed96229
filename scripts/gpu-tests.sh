#!/usr/bin/env bash
# Runs the whole test suite, GPU tests included, on the device machine:
#   device run, carry [".whl"], command: bash scripts/gpu-tests.sh
# Needs .whl/ from scripts/fetch-gpu-wheels.sh. Writes the log to $OUT when set.
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"
set -o pipefail
python3 -m pytest -q -p no:cacheprovider tests "$@" 2>&1 | tee "${OUT:-/tmp}/gpu-tests.log"
