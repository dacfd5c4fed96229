#!/usr/bin/env bash
# The PyTorch drop-in on the device machine, in one lease:
#   device run, carry [".whl"], command: bash benchmarks/gpu_torch.sh
# 1. checks what the CUDA bridge relies on, then runs the GPU tests of convtune.torch and the torch
#    strategy's registry cases (log: $OUT/gpu-torch-tests.log);
# 2. if they pass, starts benchmarks/gpu_torch_pipeline.sh in its own session (it outlives this
#    command while the machine is held), writing to /tmp/convtune-torch-results; later calls wait for
#    it and fetch what it wrote: bash benchmarks/gpu_torch_poll.sh SECONDS
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 - <<'PY'
import cupy, torch, cupy.cuda.memory as m
print("cupy", cupy.__version__, "torch", torch.__version__, "cudnn", torch.backends.cudnn.version(),
      "thread-local allocator:", hasattr(m, "_set_thread_local_allocator"),
      "raw stream:", hasattr(torch._C, "_cuda_getCurrentRawStream"))
PY
set -o pipefail
timeout 480 python3 -m pytest -q -p no:cacheprovider -x tests/test_torch_gpu.py tests/test_torch.py \
  tests/test_torch_ops.py tests/test_torch_tuning.py tests/test_strategies.py -k torch 2>&1 \
  | tee "${OUT:-/tmp}/gpu-torch-tests.log" | tail -25
rc=$?
if [ "$rc" = 0 ] && [ "${START_PIPELINE:-1}" = 1 ]; then
  setsid nohup bash benchmarks/gpu_torch_pipeline.sh /tmp/convtune-torch-results >/dev/null 2>&1 < /dev/null &
  echo "pipeline started"
fi
exit "$rc"
