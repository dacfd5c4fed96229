#!/usr/bin/env bash
# End-to-end training steps for BENCHMARKS.md's PyTorch section in one device call (issue 15), on a
# ResNet-50 plan cache made by an earlier call (benchmarks/gpu_tuning_cost.sh resnet50 writes it to
# $OUT/cost-resnet50-rules.db; copy it to .gpu-carry/resnet50.db here, carry [".whl", ".gpu-carry"]):
#   bash benchmarks/gpu_torch_e2e.sh
# ResNet-50 training steps in every mode on cached plans (convtune-fp32-native: the drop-in's own cost;
# RESNET_PROFILE profiled steps per mode: the device's busy time per step and its top kernels), host time per call, the first step of a
# fresh process with cached plans against PyTorch's, then large-kernel models tuned ahead inside
# bench-model (each part has a time limit; E2E_MODELS picks those models). The timed steps of the modes
# are interleaved (RESNET_ROUNDS, default 5; MODEL_ROUNDS, default 2: see bench-model --rounds);
# MODEL_PROFILE=N profiles N steps per mode of those models too (is a step's host time its own work or
# waiting on the device?).
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
O=${OUT:-/tmp}
DB=${RESNET50_DB:-.gpu-carry/resnet50.db}
cp "$DB" /tmp/resnet50.db || exit 1
export CONVTUNE_DB=/tmp/default.db
git rev-parse --short HEAD 2>/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
step() {
  local name=$1 limit=$2; shift 2
  local start=$(date +%s)
  timeout "$limit" "$@" > "$O/$name.out" 2>&1
  echo "== $name (exit $?, $(( $(date +%s) - start )) s)"
  grep -vE "^\s*$|it/s|tuning [0-9]+/" "$O/$name.out" | tail -${TAIL:-14}
}
BM="python3 -m convtune bench-model"
step bench-resnet50 150 $BM torchvision:resnet50 --batch 32 --steps 20 --db /tmp/resnet50.db -o "$O/bench-resnet50.json" \
  --modes "${RESNET_MODES:-torch-fp32,torch-tf32,torch-amp-bf16,convtune-fp32,convtune-fp32-native}" \
  --profile-steps "${RESNET_PROFILE:-3}" --rounds "${RESNET_ROUNDS:-5}"
step overhead-resnet50 90 python3 benchmarks/torch_overhead.py torchvision:resnet50 --batch 32 --db /tmp/resnet50.db \
  -o "$O/overhead-resnet50.json"
TAIL=4 step first-convtune-resnet50 45 $BM torchvision:resnet50 --batch 32 --modes convtune-fp32 --steps 3 --warmup 0 \
  --db /tmp/resnet50.db -o "$O/first-convtune-resnet50.json"
TAIL=4 step first-torch-resnet50 45 $BM torchvision:resnet50 --batch 32 --modes torch-fp32 --steps 3 --warmup 0 \
  -o "$O/first-torch-resnet50.json"
# E2E_MODELS: SPEC or SPEC@BATCH items (batch 16 where none is given), e.g.
#   "timm:convnext_tiny@32 convtune:slak-t@16 convtune:longconv-1d@4 convtune:replknet-31b@16"
for item in ${E2E_MODELS:-convtune:replknet-31b}; do
  m=${item%@*}; b=16; [ "$item" != "$m" ] && b=${item##*@}
  n=${m//[:\/]/-}
  step "bench-$n" ${MODEL_LIMIT:-200} $BM "$m" --batch "$b" --steps 10 --db /tmp/models.db -o "$O/bench-$n.json" \
    --modes "${MODEL_MODES:-torch-fp32,torch-tf32,torch-amp-bf16,convtune-fp32,convtune-fp32-kept}" \
    --rounds "${MODEL_ROUNDS:-2}" --profile-steps "${MODEL_PROFILE:-0}"
done
