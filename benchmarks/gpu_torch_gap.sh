#!/usr/bin/env bash
# Why the planner's winner ran slower than PyTorch fp32 on five passes of the 26th session's public-suite run
# (alexnet-conv2 wgrad 0.72x, wav2vec2-conv0 wgrad 0.78x, fbfft-L5 wgrad 0.82x, dense-k13 dgrad 0.89x, fbfft-L1 fwd
# 0.97x) while the drop-in, which duels PyTorch, stayed within 1.03x: convtune bench of those passes, then every
# candidate of their tuning run (convtune explain: the torch candidate's time as the planner measured it).
# (carry .whl; timeout_s 400)   bash benchmarks/gpu_torch_gap.sh
source "$(dirname "$0")/device_part.sh"
part bench-wgrad 150 python3 -m convtune bench public-suite --layers alexnet-conv2,wav2vec2-conv0,fbfft-L5 \
  --passes wgrad --time-budget 3 --db /tmp/gap.db -o "$O/bench-wgrad.json"
grep -sE "^(alexnet|wav2vec2|fbfft)" "$O/bench-wgrad.log"
part bench-dgrad 80 python3 -m convtune bench public-suite --layers dense-k13 --passes dgrad --time-budget 3 \
  --db /tmp/gap.db -o "$O/bench-dgrad.json"
grep -sE "^dense" "$O/bench-dgrad.log"
for l in alexnet-conv2:wgrad wav2vec2-conv0:wgrad fbfft-L5:wgrad dense-k13:dgrad; do
  part "explain-${l%%:*}" 40 python3 -m convtune explain "${l%%:*}" --net public-suite --pass "${l##*:}" --db /tmp/gap.db
  grep -sE "torch|winner|won|ok " "$O/explain-${l%%:*}.log" | head -8
done
