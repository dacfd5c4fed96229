#!/usr/bin/env bash
# The FFT-speed issue's device run, meant for the background (setsid) while
# benchmarks/gpu_collect.sh fetches what is done: the strategy and GPU tests, the step-by-step
# probe of the FFT plans (benchmarks/fft_phases.py), the FFT target layers of the public suite in
# fp32, and every candidate of their tuning runs (convtune explain). Results land in /tmp/gpu-results.
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
R=/tmp/gpu-results
mkdir -p $R
LAYERS=${LAYERS:-fbfft-L2,fbfft-L3,fbfft-L4,dense-k13,dense-k31,hyena-long-dw}
TESTS=${TESTS:-tests/test_strategies.py tests/test_gpu.py}  # PHASES=0 leaves the step-by-step probe out
{
  echo "start $(date -u +%FT%TZ)"
  python3 -m pytest -q -p no:cacheprovider $TESTS > $R/gpu-tests.log 2>&1
  echo "tests exit $? $(date -u +%T): $(tail -n 1 $R/gpu-tests.log)"
  if [ "${PHASES:-1}" != 0 ]; then
    python3 benchmarks/fft_phases.py fbfft-L2,fbfft-L4,dense-k31 > $R/phases.txt 2>&1; echo "phases exit $? $(date -u +%T)"
  fi
  python3 -m convtune bench .carry/layers.yaml --layers $LAYERS --math fp32 --time-budget 3 --db /tmp/fft-plans.db \
    -o $R/bench-fft-fp32.json > $R/bench-fft-fp32.txt 2> $R/bench-fft-fp32.err; echo "bench exit $? $(date -u +%T)"
  for l in ${LAYERS//,/ }; do
    python3 -m convtune explain $l --net .carry/layers.yaml --db /tmp/fft-plans.db
  done > $R/explain.txt 2>&1; echo "explain exit $? $(date -u +%T)"
  echo "done $(date -u +%FT%TZ)"
} > $R/progress.log 2>&1
