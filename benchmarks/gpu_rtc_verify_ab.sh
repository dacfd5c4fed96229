#!/usr/bin/env bash
# A/B, on the GPU, of verifying cuDNN's runtime-compiled plans at the full batch (Strategy.verified_at_full_batch,
# 02f32cb) against building them again for the verification batch (the behaviour before): a network tuned under AMP
# from an empty plan cache, once each way, one process after the other (carry .whl):
#   NET=torchvision:resnet50 bash benchmarks/gpu_rtc_verify_ab.sh
# Compare the "cudnn" rows' build column and the totals (machines differ by 15% between calls: compare within one).
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
O=${OUT:-/tmp}
NET=${NET:-torchvision:resnet50}
for run in before after; do
  rm -f "$O/rtc-$run.db"
  patch=""
  if [ "$run" = before ]; then
    patch="import convtune.strategies.cudnn as c; c.CudnnStrategy.verified_at_full_batch = lambda self, p, config: False"
  fi
  start=$(date +%s)
  timeout "${LIMIT:-300}" python3 -c "$patch
from convtune.cli import main
main(['tune', '$NET', '--batch', '32', '--dtype', 'bfloat16', '--layout', 'channels_last', '--db', '$O/rtc-$run.db'])" \
    > "$O/rtc-$run.txt" 2>&1
  echo "== $run (exit $?, $(( $(date +%s) - start )) s wall)"
  grep -E "tuned, |^cudnn |^torch |^depthwise |^im2col " "$O/rtc-$run.txt"
done
