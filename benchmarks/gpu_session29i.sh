#!/usr/bin/env bash
# The 29th session's ninth call (carry .whl; timeout_s 300): the replay's last form (its bookkeeping under its lock, no
# capture of its own while the caller's stream captures): the replay, cuBLASLt, cuDNN and drop-in GPU tests, and the
# 1x1 host parts again.
#   bash benchmarks/gpu_session29i.sh
source "$(dirname "$0")/device_part.sh"
gpu_tests tests 200 tests/test_cublaslt.py tests/test_cudnn.py tests/test_torch_gpu.py
part parts 90 python3 benchmarks/pointwise_host_parts.py
grep -E "==|ArrayPlan call|launch\(|torch conv2d|graphs made" "$O/parts.log" | head -40
