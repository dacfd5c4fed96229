#!/usr/bin/env bash
# The 29th session's eighth call (carry .whl; timeout_s 590): issue 15's fp32 end-to-end rows at this commit (the 1x1
# and cuDNN plans replayed from CUDA graphs): RepLKNet-31B-style at batch 16 eager (fresh cache, interleaved, PyTorch
# against itself too) and with whole steps in CUDA graphs (same cache); ConvNeXt-T (timm) at batch 32 eager.
#   bash benchmarks/gpu_session29h.sh
source "$(dirname "$0")/device_part.sh"
BM="python3 -m convtune bench-model"
part rep-eager 300 $BM convtune:replknet-31b --batch 16 --steps 10 --rounds 4 --null --modes torch-fp32,convtune-fp32 \
  --db /tmp/rep.db -o "$O/rep-eager.json"
grep -vE "leaked|^ - |nanobind|See https" "$O/rep-eager.log" | tail -7 | cut -c1-220
part rep-graph 100 $BM convtune:replknet-31b --graph --batch 16 --steps 10 --modes torch-fp32,convtune-fp32 \
  --db /tmp/rep.db -o "$O/rep-graph.json"
grep -vE "leaked|^ - |nanobind|See https" "$O/rep-graph.log" | tail -6 | cut -c1-220
part cnx-eager 170 $BM timm:convnext_tiny --batch 32 --steps 16 --rounds 4 --null --modes torch-fp32,convtune-fp32 \
  --db /tmp/cnx.db -o "$O/cnx-eager.json"
grep -vE "leaked|^ - |nanobind|See https" "$O/cnx-eager.log" | tail -7 | cut -c1-220
