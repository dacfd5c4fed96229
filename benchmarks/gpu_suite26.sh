#!/usr/bin/env bash
# The public per-layer suite in fp32 at the current commit, in two device calls (carry .whl; timeout_s 600 each):
#   bash benchmarks/gpu_suite26.sh 1; bash benchmarks/gpu_suite26.sh 2
# convtune bench public-suite, every peer (torch-fft in fp32 math), fresh cache, each half into $O/suite-N.json; then
# `python3 benchmarks/bench_tables.py suite-1.json suite-2.json --round-trips` here. Against run 21 (2026-11-22):
# issue 22's "no layer of the public suite gets slower".
source "$(dirname "$0")/device_part.sh"
half1=fbfft-L1,fbfft-L2,fbfft-L3,fbfft-L4,fbfft-L5,alexnet-conv1,alexnet-conv2,vgg16-conv1_2,resnet50-conv1,resnet50-res2-3x3
half2=resnet50-res2-1x1,resnet50-res3-3x3s2,resnet50-res5-3x3,convnext-t-dw7,dense-k13,dense-k31,wav2vec2-conv0,temporal-k5,hyena-long-dw
layers=$([ "$1" = 2 ] && echo $half2 || echo $half1)
part "suite-$1" 560 python3 -m convtune bench public-suite --layers "$layers" --time-budget 3 --db /tmp/suite.db \
  -o "$O/suite-$1.json"
grep -sE "round trip|within|misses" "$O/suite-$1.log"
