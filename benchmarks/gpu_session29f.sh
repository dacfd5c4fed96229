#!/usr/bin/env bash
# The 29th session's sixth call (carry .whl; timeout_s 590): issue 16's RepLKNet-31B-style target (3.7x PyTorch AMP)
# at this commit: bench-model with whole steps captured in CUDA graphs at batch 16 from a fresh cache (tuning ahead
# included), then eager on the same cache, interleaved, PyTorch against itself too.
#   bash benchmarks/gpu_session29f.sh
source "$(dirname "$0")/device_part.sh"
part graph 430 python3 -m convtune bench-model convtune:replknet-31b --graph --batch 16 --steps 10 \
  --modes torch-amp-bf16,convtune-amp-bf16 --db /tmp/rep.db -o "$O/graph.json"
grep -vE "leaked|^ - |nanobind|See https" "$O/graph.log" | tail -9 | cut -c1-220
part eager 140 python3 -m convtune bench-model convtune:replknet-31b --batch 16 --steps 10 --rounds 4 --null \
  --modes torch-amp-bf16,convtune-amp-bf16 --db /tmp/rep.db -o "$O/eager.json"
grep -vE "leaked|^ - |nanobind|See https" "$O/eager.log" | tail -9 | cut -c1-220
