#!/usr/bin/env bash
# The 28th session's fifth call (carry .whl, which holds base.tgz, `git archive` of e05f121; timeout_s 420): 88a1fc2
# moved stockham_pass's twiddles and DFT into a butterfly helper that fft-plane's kernels also use. replknet-dw31's
# and slak-dw51's block trips at e05f121 and now, side by side with the torch-fft peer; then fft-plane's GPU tests.
#   bash benchmarks/gpu_session28e.sh
source "$(dirname "$0")/device_part.sh"
rm -rf /tmp/base && mkdir -p /tmp/base && tar xzf .whl/base.tgz -C /tmp/base
(cd /tmp/base/base && PYTHONPATH=/tmp/site:/tmp/base/base timeout 150 python3 benchmarks/block_trips.py \
  --layers replknet-dw31,slak-dw51 --side-by-side 30 -o "$O/trips-planes-base.json" > "$O/trips-planes-base.log" 2>&1;
  echo "== trips-planes-base (exit $?)")
grep -sE "^==" "$O/trips-planes-base.log"
trips trips-planes 150 --layers replknet-dw31,slak-dw51 --side-by-side 30
gpu_tests tests-planes 150 tests/test_planeconv.py
