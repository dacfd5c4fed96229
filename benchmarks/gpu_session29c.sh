#!/usr/bin/env bash
# The 29th session's third call (carry .whl; timeout_s 200): a 1x1 plan's GEMM captured in a CUDA graph and replayed
# by address (benchmarks/graph_replay_probe.py: cuBLAS and cuBLASLt, results and host µs per call).
#   bash benchmarks/gpu_session29c.sh
source "$(dirname "$0")/device_part.sh"
part probe 150 python3 benchmarks/graph_replay_probe.py
cat "$O/probe.log" | cut -c1-250 | head -60
