#!/usr/bin/env bash
# The 28th session's sixth call (carry .whl; timeout_s 330): 16-bit transposes four at a time in registers
# (convtune_transpose16_quads) against the pairs through shared memory, on fbfft-L2's channels_last operands
# (benchmarks/transpose16_probe.py); the transposes' GPU tests; fbfft-L2 in bfloat16 channels_last (tf32) through
# `convtune bench` with the quads (issue 16's 2x).
#   bash benchmarks/gpu_session28f.sh
source "$(dirname "$0")/device_part.sh"
part probe 60 python3 benchmarks/transpose16_probe.py
cat "$O/probe.log" | cut -c1-250
gpu_tests tests 60 tests/test_fft64.py -k transposes
part bench-bf16 190 python3 -m convtune bench benchmarks/public_suite_small_first.yaml --layers fbfft-L2 \
  --dtype bfloat16 --layout channels_last --math tf32 --time-budget 10 --db /tmp/h.db -o "$O/bench-bf16.json"
grep -sE "fbfft-L2 |misses" "$O/bench-bf16.log" | cut -c1-220
