#!/usr/bin/env bash
# The 28th session's fourth call (carry .whl; timeout_s 300): resnet50-res5-3x3 and wav2vec2-conv0, the two layers
# still slower than run 21 through the array API in the third call (same cuDNN engines and PyTorch plans), through
# `convtune bench public-suite` twice more, each with a fresh cache: is it the layer or the run?
#   bash benchmarks/gpu_session28d.sh
source "$(dirname "$0")/device_part.sh"
for i in 1 2; do
  part "suite-two-$i" 120 python3 -m convtune bench public-suite --layers resnet50-res5-3x3,wav2vec2-conv0 \
    --time-budget 3 --db "/tmp/suite-two-$i.db" -o "$O/suite-two-$i.json"
  grep -sE "round trip|within|overhead" "$O/suite-two-$i.log" | cut -c1-200
done
