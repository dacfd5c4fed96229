#!/usr/bin/env bash
# The 27th session's fourth call (carry .whl; timeout_s 600): dense-k31 through convtune bench again, the drop-in's
# record now with PyTorch's allocator counts over its timed calls (its backward-data took 0.925 ms, spread 0.67,
# against the array call's 0.428 in the second call); then issue 16's fbfft-L2 in bfloat16 channels_last, tf32 math,
# as the 22nd session measured it (1.96x), after the round trips' host trims.
#   bash benchmarks/gpu_session27d.sh
source "$(dirname "$0")/device_part.sh"
part bench-dense 150 python3 -m convtune bench public-suite --layers dense-k31 --time-budget 2 --db /tmp/b.db \
  -o "$O/bench-dense.json"
grep -sE "dense-k31 |misses" "$O/bench-dense.log"
python3 -c "import json; [print(k, v.get('drop_in')) for k, v in json.load(open('$O/bench-dense.json'))['layers'][0]['passes'].items()]"
part bench-bf16 300 python3 -m convtune bench benchmarks/public_suite_small_first.yaml --layers fbfft-L2 \
  --dtype bfloat16 --layout channels_last --math tf32 --time-budget 10 --db /tmp/h.db -o "$O/bench-bf16.json"
grep -sE "fbfft-L2 |misses" "$O/bench-bf16.log"
