#!/usr/bin/env bash
# Device-machine run for BENCHMARKS.md (issue 17): what tuning costs, and what the rules and early
# stopping lose. Per network: `convtune tune` on a fresh cache (timed, with its "where the time went"
# table), then `--exhaustive` on another fresh cache, then both runs' winners re-timed side by side
# (benchmarks/compare_plans.py). Carry .whl (scripts/fetch-gpu-wheels.sh). Writes to $OUT.
#   bash benchmarks/gpu_tuning_cost.sh [resnet50 convnext-tiny public-suite]
# MODES picks the searches (default "rules exhaustive"; the comparison needs both). Time limits: TUNE_LIMIT (rules run), EXHAUSTIVE_LIMIT, COMPARE_LIMIT seconds (default 300 each). Each
# run's database is copied to $OUT/cost-NAME-MODE.db (plans and measurements: carry them back).
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
nets=("${@:-resnet50 timm:convnext_tiny public-suite}")
for net in ${nets[@]}; do
  bf="--batch 32"; [ "$net" = public-suite ] && bf=""  # the suite's layers keep their own batch sizes
  name=${net//[:\/]/-}
  for mode in ${MODES:-rules exhaustive}; do
    db=/tmp/cost-$name-$mode.db
    rm -f "$db"*
    flag=""; [ "$mode" = exhaustive ] && flag="--exhaustive"
    start=$(date +%s%N)
    limit=${TUNE_LIMIT:-300}; [ "$mode" = exhaustive ] && limit=${EXHAUSTIVE_LIMIT:-300}
    timeout "$limit" python3 -m convtune tune "$net" $bf --db "$db" $flag > "$OUT/tune-$name-$mode.txt" \
      2> "$OUT/tune-$name-$mode.err"
    rc=$?
    end=$(date +%s%N)
    echo "$net $mode: exit $rc, wall $(( (end - start) / 1000000 )) ms (process start to exit)"
    grep -E "tuned, " "$OUT/tune-$name-$mode.txt"
    grep -A14 "of tuning went" "$OUT/tune-$name-$mode.txt"
    python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" \
      "$db" "$OUT/cost-$name-$mode.db"
  done
  [ -f /tmp/cost-$name-rules.db ] && [ -f /tmp/cost-$name-exhaustive.db ] || continue
  timeout "${COMPARE_LIMIT:-300}" python3 benchmarks/compare_plans.py /tmp/cost-$name-rules.db /tmp/cost-$name-exhaustive.db --backend cupy \
    > "$OUT/compare-$name.txt" 2>&1
  tail -3 "$OUT/compare-$name.txt"
done
