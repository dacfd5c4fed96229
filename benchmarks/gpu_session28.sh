#!/usr/bin/env bash
# The 28th session's first call (carry .whl, which also holds base.tgz: `git archive --prefix=base/ HEAD` of the
# commit before the change; timeout_s 600): the one-block row kernels with the forward's first pass reading the row
# and the inverse's last pass writing the result (no load and store phases through shared memory), and shared
# memory padded after as many points as the first pass's radix. long-16k-dw's and hyena-long-dw's block trips timed
# at the base commit, with the change, and with the change but the old pad (CONVTUNE_ROW_PAD_SHIFT=3); then the
# GPU tests of the row kernels and the round trips. CONVTUNE_ROW_PAD_SHIFT was a temporary override in
# rowconv.source for this call only; the committed code (pad_shift) has no such variable, and its first pass also
# steps its row pointer instead of multiplying the index (the second call, gpu_session28b.sh, ran that).
#   bash benchmarks/gpu_session28.sh
source "$(dirname "$0")/device_part.sh"
rm -rf /tmp/base && mkdir -p /tmp/base && tar xzf .whl/base.tgz -C /tmp/base
here=$PWD
base_trips() {
  (cd /tmp/base/base && PYTHONPATH=/tmp/site:/tmp/base/base timeout 200 python3 benchmarks/block_trips.py "$@" \
    -o "$O/trips-base.json" > "$O/trips-base.log" 2>&1; echo "== trips-base (exit $?)")
  grep -sE "^==" "$O/trips-base.log"
}
base_trips --layers long-16k-dw,hyena-long-dw --side-by-side 30
trips trips-new 200 --layers long-16k-dw,hyena-long-dw --side-by-side 30
CONVTUNE_ROW_PAD_SHIFT=3 trips trips-new-pad8 150 --layers long-16k-dw --side-by-side 30
gpu_tests tests 200 tests/test_rowconv.py tests/test_roundtrip.py
