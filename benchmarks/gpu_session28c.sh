#!/usr/bin/env bash
# The 28th session's third call (carry .whl; timeout_s 600), at the rows' fused first and last passes: the four
# public-suite layers that run 26 timed slower than run 21 on the same cuDNN engines (issue 22's "no layer of the
# public suite gets slower"), and hyena-long-dw, through `convtune bench public-suite` as run 26 ran them (fresh
# cache, every peer).
#   bash benchmarks/gpu_session28c.sh
source "$(dirname "$0")/device_part.sh"
part suite-four 300 python3 -m convtune bench public-suite --layers fbfft-L5,wav2vec2-conv0,alexnet-conv2,resnet50-res5-3x3 \
  --time-budget 3 --db /tmp/suite.db -o "$O/suite-four.json"
grep -sE "round trip|within|misses|overhead" "$O/suite-four.log"
part suite-hyena 250 python3 -m convtune bench public-suite --layers hyena-long-dw --time-budget 3 --db /tmp/suite.db \
  -o "$O/suite-hyena.json"
grep -sE "round trip|within|misses" "$O/suite-hyena.log"
