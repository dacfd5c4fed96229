#!/usr/bin/env bash
# The 29th session's fourth call (carry .whl; timeout_s 590): the 1x1 plans' forward and backward-data GEMMs through
# cuBLASLt, replayed from CUDA graphs per operand addresses (convtune.direct.replay): their GPU tests and the
# drop-in's; their host and device time against the cuBLAS form (benchmarks/pointwise_host_parts.py); ResNet-50's
# host cost per call (benchmarks/torch_overhead.py, plans.db.example copied; issue 15's +10 µs).
#   bash benchmarks/gpu_session29d.sh
source "$(dirname "$0")/device_part.sh"
gpu_tests tests 200 tests/test_cublaslt.py tests/test_torch_gpu.py
part parts 120 python3 benchmarks/pointwise_host_parts.py
cat "$O/parts.log" | cut -c1-200 | grep -v "^ *$" | head -80
cp plans.db.example /tmp/r50.db
part overhead 240 python3 benchmarks/torch_overhead.py torchvision:resnet50 --batch 32 --db /tmp/r50.db -o "$O/overhead.json"
tail -8 "$O/overhead.log" | cut -c1-200
