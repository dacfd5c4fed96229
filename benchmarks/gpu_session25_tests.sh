#!/usr/bin/env bash
# The 25th session's check of its last change on a GPU (carry .whl; timeout_s 330): every GPU test of fft-row and
# fft-plane (their modules now hold only the kernels a pass launches) and of the block round trips, with the slowest
# tests' durations (compilation was most of them):
#   bash benchmarks/gpu_session25_tests.sh
source "$(dirname "$0")/device_part.sh"
gpu_tests tests 280 --durations=8 tests/test_rowconv.py tests/test_planeconv.py tests/test_roundtrip.py \
  -k "test_rowconv or test_planeconv or block or trip"
grep -sA10 "slowest" "$O/tests.log"
