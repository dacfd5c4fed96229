#!/usr/bin/env bash
# Device-machine run for BENCHMARKS.md: `convtune tune resnet50 --batch 32` twice on a fresh
# SQLite cache, with wall times, then the cache as plans.db.example. Writes to $OUT.
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
db=/tmp/resnet50-b32.db
rm -f "$db"*
for run in first second; do
  start=$(date +%s%N)
  python3 -m convtune tune resnet50 --batch 32 --db "$db" > "$OUT/tune-$run.txt" 2> "$OUT/tune-$run.err"
  rc=$?
  end=$(date +%s%N)
  echo "$run run: exit $rc, wall $(( (end - start) / 1000000 )) ms (process start to exit)"
  tail -3 "$OUT/tune-$run.txt"
done
python3 - "$db" "$OUT/plans.db.example" <<'PY'
import sqlite3, sys, shutil
con = sqlite3.connect(sys.argv[1]); con.execute("PRAGMA wal_checkpoint(TRUNCATE)"); con.execute("VACUUM"); con.close()
shutil.copy(sys.argv[1], sys.argv[2])
PY
python3 -m convtune show --db "$OUT/plans.db.example" | tail -2
