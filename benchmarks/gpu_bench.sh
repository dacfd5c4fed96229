#!/usr/bin/env bash
# Device-machine run for BENCHMARKS.md: the public suite (../shared/bench/layers.yaml, carried as
# .carry/layers.yaml) in one math mode, then the figures. Usage: bash benchmarks/gpu_bench.sh fp32|tf32 [extra bench args]
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
math=${1:-fp32}; shift
suite=${SUITE:-.carry/layers.yaml}
python3 -m convtune bench "$suite" --math "$math" --time-budget 3 --db /tmp/bench-plans.db \
  -o "$OUT/bench-$math.json" "$@" 2> "$OUT/bench-$math.err" | tee "$OUT/bench-$math.txt"
python3 -m convtune report "$OUT/bench-$math.json" -o "$OUT/report-$math" > /dev/null && cp "$OUT"/report-$math/*.png "$OUT/" 2>/dev/null
rm -rf "$OUT/report-$math"
