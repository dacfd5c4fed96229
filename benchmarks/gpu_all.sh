#!/usr/bin/env bash
# The whole device-machine benchmark for BENCHMARKS.md, meant to run in the background
# (setsid) while benchmarks/gpu_collect.sh fetches what is done: the GPU tests, the public
# suite in fp32 and tf32, and the synthetic sweep. Results land in /tmp/gpu-results.
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
R=/tmp/gpu-results
mkdir -p $R
{
  echo "start $(date -u +%FT%TZ)"
  python3 -m pytest -q -p no:cacheprovider tests > $R/gpu-tests.log 2>&1; echo "tests exit $? $(date -u +%T)"
  for math in fp32 tf32; do
    python3 -m convtune bench .carry/layers.yaml --math $math --time-budget 2 --db /tmp/bench-plans.db \
      -o $R/bench-$math.json > $R/bench-$math.txt 2> $R/bench-$math.err; echo "bench $math exit $? $(date -u +%T)"
  done
  python3 -m convtune bench --sweep --sweep-inputs 16,32,64 --math fp32 --time-budget 2 --db /tmp/bench-plans.db \
    -o $R/sweep-fp32.json > $R/sweep-fp32.txt 2> $R/sweep-fp32.err; echo "sweep exit $? $(date -u +%T)"
  for f in bench-fp32 bench-tf32 sweep-fp32; do
    python3 -m convtune report $R/$f.json -o $R/report-$f > /dev/null 2>&1 && echo "report $f ok"
  done
  echo "done $(date -u +%FT%TZ)"
} > $R/progress.log 2>&1
