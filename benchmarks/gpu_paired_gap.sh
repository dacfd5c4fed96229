#!/usr/bin/env bash
# What makes a round trip slower right after the torch-fft peer (carry .whl; timeout_s 300):
#   bash benchmarks/gpu_paired_gap.sh
source "$(dirname "$0")/device_part.sh"
part gap 250 python3 benchmarks/paired_gap.py --layers replknet-dw31,hyena-long-dw,slak-dw51 -o "$O/gap.json"
grep -sE "^\{|Error|error" "$O/gap.log" | head -20
