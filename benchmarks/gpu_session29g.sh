#!/usr/bin/env bash
# The 29th session's seventh call (carry .whl; timeout_s 590): cuDNN plans' executions replayed from CUDA graphs per
# operand addresses too (convtune.direct.replay): the drop-in's replay tests (1x1 and cuDNN), the launch-path and
# cuDNN GPU tests; ResNet-50's host cost per call with replay off (CONVTUNE_REPLAY=0) and on, each on a fresh copy
# of plans.db.example; ResNet-50's fp32 training step through the drop-in.
#   bash benchmarks/gpu_session29g.sh
source "$(dirname "$0")/device_part.sh"
gpu_tests tests 240 tests/test_cublaslt.py tests/test_cudnn.py tests/test_torch_gpu.py
cp plans.db.example /tmp/r50-off.db
CONVTUNE_REPLAY=0 part overhead-off 150 python3 benchmarks/torch_overhead.py torchvision:resnet50 --batch 32 \
  --db /tmp/r50-off.db -o "$O/overhead-off.json"
grep -A5 "^host us" "$O/overhead-off.log"
cp plans.db.example /tmp/r50.db
part overhead 150 python3 benchmarks/torch_overhead.py torchvision:resnet50 --batch 32 --db /tmp/r50.db \
  -o "$O/overhead.json"
grep -A5 "^host us" "$O/overhead.log"
cp plans.db.example /tmp/r50-e2e.db
part e2e 150 python3 -m convtune bench-model torchvision:resnet50 --batch 32 --steps 32 --rounds 8 --null \
  --modes torch-fp32,convtune-fp32 --db /tmp/r50-e2e.db -o "$O/e2e.json"
grep -vE "leaked|^ - |nanobind|See https" "$O/e2e.log" | tail -7 | cut -c1-220
