#!/usr/bin/env bash
# The end-to-end measurements of BENCHMARKS.md's PyTorch section, one after the other, on the device
# machine (started by benchmarks/gpu_torch.sh; fetch with benchmarks/gpu_torch_poll.sh):
#   bash benchmarks/gpu_torch_pipeline.sh RESULTS_DIR
# Each step's output is RESULTS_DIR/STEP.out, its JSON RESULTS_DIR/STEP.json; RESULTS_DIR/pipeline.log
# says when each started and ended. Plans: RESULTS_DIR/resnet50.db (ResNet-50, tuned by the CLI first,
# so that its bench and the host-overhead bench run on cached plans) and RESULTS_DIR/models.db (the
# other models, tuned ahead inside bench-model's convtune mode).
set -u
cd "$(dirname "$0")/.."
R=${1:-/tmp/convtune-torch-results}
mkdir -p "$R"
source scripts/gpu-env.sh >/dev/null 2>&1
export CONVTUNE_DB="$R/default.db"
git rev-parse --short HEAD > "$R/commit" 2>/dev/null || true
step() {
  local name=$1 limit=$2; shift 2
  echo "[$(date -u +%H:%M:%S)] start $name: $*" >> "$R/pipeline.log"
  timeout "$limit" "$@" > "$R/$name.out" 2>&1
  echo "[$(date -u +%H:%M:%S)] end $name rc=$?" >> "$R/pipeline.log"
}
BM="python3 -m convtune bench-model"
step tune-resnet50 900 python3 -m convtune tune torchvision:resnet50 --batch 32 --db "$R/resnet50.db" --backend cupy
step bench-resnet50 600 $BM torchvision:resnet50 --batch 32 --db "$R/resnet50.db" -o "$R/bench-resnet50.json"
step overhead-resnet50 600 python3 benchmarks/torch_overhead.py torchvision:resnet50 --batch 32 --db "$R/resnet50.db" \
  -o "$R/overhead-resnet50.json"
step bench-longconv 900 $BM convtune:longconv-1d --batch 4 --steps 10 --db "$R/models.db" -o "$R/bench-longconv.json"
step bench-convnext 900 $BM timm:convnext_tiny --batch 32 --db "$R/models.db" -o "$R/bench-convnext.json"
step bench-slak 1200 $BM convtune:slak-t --batch 16 --steps 10 --db "$R/models.db" -o "$R/bench-slak.json"
step bench-replknet 1500 $BM convtune:replknet-31b --batch 16 --steps 10 --db "$R/models.db" -o "$R/bench-replknet.json"
# the first step with cached plans against PyTorch's own first step, each in a fresh process
step first-convtune-resnet50 300 $BM torchvision:resnet50 --batch 32 --modes convtune-fp32 --steps 5 --warmup 0 \
  --db "$R/resnet50.db" -o "$R/first-convtune-resnet50.json"
step first-torch-resnet50 300 $BM torchvision:resnet50 --batch 32 --modes torch-fp32 --steps 5 --warmup 0 \
  -o "$R/first-torch-resnet50.json"
echo "[$(date -u +%H:%M:%S)] done" >> "$R/pipeline.log"
