#!/usr/bin/env bash
# Closing device run for the FFT-speed work: the whole GPU test suite, then the FFT target layers
# in tf32 mode (fp32 is benchmarks/gpu_fft.sh). Results land in /tmp/gpu-results.
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
R=/tmp/gpu-results
mkdir -p $R
LAYERS=${LAYERS:-fbfft-L2,fbfft-L3,fbfft-L4,dense-k13,dense-k31,hyena-long-dw}
{
  echo "start $(date -u +%FT%TZ)"
  python3 -m pytest -q -p no:cacheprovider tests > $R/gpu-tests.log 2>&1
  echo "tests exit $? $(date -u +%T): $(tail -n 1 $R/gpu-tests.log)"
  python3 -m convtune bench .carry/layers.yaml --layers $LAYERS --math tf32 --time-budget 3 --db /tmp/fft-plans.db \
    -o $R/bench-fft-tf32.json > $R/bench-fft-tf32.txt 2> $R/bench-fft-tf32.err; echo "bench exit $? $(date -u +%T)"
  echo "done $(date -u +%FT%TZ)"
} > $R/progress.log 2>&1
