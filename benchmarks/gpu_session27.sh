#!/usr/bin/env bash
# The 27th session's first call (carry .whl; timeout_s 600): the 26th session's CPU-tested host trims (a7b91b8,
# d873092) on the GPU: dense-k31's trip host profile, every round-trip candidate of dense-k31 timed by its summed passes
# and whole (with its host time), then the GPU tests of the frequency-major executor and the round trips.
#   bash benchmarks/gpu_session27.sh
source "$(dirname "$0")/device_part.sh"
part host-dense 120 python3 benchmarks/trip_host_profile.py --layers dense-k31
grep -s "^==" "$O/host-dense.log"
trips trips-dense 240 --all --layers dense-k31 --side-by-side 40
gpu_tests tests 200 tests/test_roundtrip.py tests/test_narrow.py tests/test_fft64.py tests/test_spectral_kernels.py
