#!/usr/bin/env bash
# The 29th session's second call (carry .whl; timeout_s 560): bfloat16 round trips that read 16 bits timed on 16-bit
# memory (convtune.roundtrip.timed_steps, as the PyTorch layer hands them over and as per-pass plans are timed):
# the round trips' GPU tests, fbfft-L2 in bfloat16 channels_last (tf32) through `convtune bench` (fresh cache: the
# trip decided and timed the new way), and the layer through the drop-in (issue 16's 2x).
#   bash benchmarks/gpu_session29b.sh
source "$(dirname "$0")/device_part.sh"
gpu_tests tests 150 tests/test_roundtrip.py
part bench-bf16 200 python3 -m convtune bench benchmarks/public_suite_small_first.yaml --layers fbfft-L2 \
  --dtype bfloat16 --layout channels_last --math tf32 --time-budget 10 --db /tmp/h.db -o "$O/bench-bf16.json"
grep -sE "fbfft-L2 |misses|within" "$O/bench-bf16.log" | cut -c1-260
part dropin 150 python3 benchmarks/layer_dropin_half.py --tf32
cat "$O/dropin.log" | cut -c1-250
