#!/usr/bin/env bash
# Wait up to $1 seconds for benchmarks/gpu_all.sh to finish, then copy what it wrote to $OUT
# (a tar of everything plus the progress log).
wait_s=${1:-500}
R=/tmp/gpu-results
for ((i = 0; i < wait_s; i += 10)); do
  grep -q "^done" $R/progress.log 2>/dev/null && break
  sleep 10
done
cat $R/progress.log
tail -n 3 $R/*.err 2>/dev/null | tail -n 8
tar -C /tmp -czf "$OUT/gpu-results.tgz" gpu-results
