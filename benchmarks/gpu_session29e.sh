#!/usr/bin/env bash
# The 29th session's fifth call (carry .whl; timeout_s 590): the 1x1 plans replayed from CUDA graphs, again: the
# drop-in's replay test (reworked) and the cuBLASLt tests; ResNet-50's host cost per call with the cuBLAS form
# (CONVTUNE_CUBLASLT=0) and by default, each on a fresh copy of plans.db.example, in this one process's machine;
# then ResNet-50's fp32 training step through the drop-in against PyTorch (bench-model, interleaved, --null).
#   bash benchmarks/gpu_session29e.sh
source "$(dirname "$0")/device_part.sh"
gpu_tests tests 150 tests/test_cublaslt.py tests/test_torch_gpu.py -k "cublaslt or replayed or launch_path"
cp plans.db.example /tmp/r50-cublas.db
CONVTUNE_CUBLASLT=0 part overhead-cublas 150 python3 benchmarks/torch_overhead.py torchvision:resnet50 --batch 32 \
  --db /tmp/r50-cublas.db -o "$O/overhead-cublas.json"
tail -5 "$O/overhead-cublas.log" | grep -E "fwd|grad|host us"
cp plans.db.example /tmp/r50.db
part overhead 150 python3 benchmarks/torch_overhead.py torchvision:resnet50 --batch 32 --db /tmp/r50.db \
  -o "$O/overhead.json"
grep -A5 "^host us" "$O/overhead.log"
cp plans.db.example /tmp/r50-e2e.db
part e2e 240 python3 -m convtune bench-model torchvision:resnet50 --batch 32 --steps 32 --rounds 8 --null \
  --modes torch-fp32,convtune-fp32 --db /tmp/r50-e2e.db -o "$O/e2e.json"
grep -vE "leaked|^ - |nanobind|See https" "$O/e2e.log" | tail -14 | cut -c1-220
