#!/usr/bin/env bash
# The 29th session's first call (carry .whl; timeout_s 400): the packed TF32 product with a deeper pipeline and
# optionally persistent blocks (benchmarks/packed_tf32_pipeline.py: fbfft-L2's products alone, every variant against
# the replaced kernel, then the bfloat16 channels_last round trip with each), and the packed products' GPU tests.
#   bash benchmarks/gpu_session29.sh
source "$(dirname "$0")/device_part.sh"
part probe 240 python3 benchmarks/packed_tf32_pipeline.py
grep -v "^ *$" "$O/probe.log" | cut -c1-220 | head -80
gpu_tests tests 120 tests/test_narrow.py
