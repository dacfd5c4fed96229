#!/usr/bin/env bash
# The 27th session's sixth call (carry .whl; timeout_s 420): the passes from kept spectra (the forward- and
# backward-data-keeping kernels, the inverses from kept spectra) take their frequency pairs in an unrolled loop, so
# later pairs' loads issue before earlier pairs' stores. long-16k-dw's radix-32 trip and hyena's trips timed, the
# best side by side with the peer; the row and round-trip GPU tests.
# The unrolled loops it measured were slower (long-16k-dw 0.616 against 0.549 ms) and were not committed.
#   bash benchmarks/gpu_session27f.sh
source "$(dirname "$0")/device_part.sh"
trips trips-long 100 --layers long-16k-dw --only "radices=32" --side-by-side 40
trips trips-hyena 120 --layers hyena-long-dw --side-by-side 40
gpu_tests tests 180 tests/test_rowconv.py tests/test_roundtrip.py
