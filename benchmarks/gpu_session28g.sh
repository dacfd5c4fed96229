#!/usr/bin/env bash
# The 28th session's seventh call (carry .whl; timeout_s 150): the quads transpose as committed (one tile a block,
# without the template the sixth call ran with ITER = 1): its GPU tests and benchmarks/transpose16_probe.py again.
#   bash benchmarks/gpu_session28g.sh
source "$(dirname "$0")/device_part.sh"
gpu_tests tests 60 tests/test_fft64.py -k transposes
part probe 60 python3 benchmarks/transpose16_probe.py
cat "$O/probe.log" | cut -c1-250
