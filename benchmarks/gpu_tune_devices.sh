#!/usr/bin/env bash
# Two-GPU device run (kind nvidia-h200-x2) for BENCHMARKS.md (issue 17): `convtune tune --devices 0,1`
# against one GPU, wall time and winners (benchmarks/compare_plans.py re-times any that differ).
# Carry .whl (scripts/fetch-gpu-wheels.sh). Writes to $OUT.
#   bash benchmarks/gpu_tune_devices.sh [resnet50 public-suite]
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
nvidia-smi -L
nets=("${@:-resnet50 public-suite}")
for net in ${nets[@]}; do
  bf="--batch 32"; [ "$net" = public-suite ] && bf=""  # the suite's layers keep their own batch sizes
  for devices in 0 0,1; do
    db=/tmp/devices-$net-${devices/,/-}.db
    rm -f "$db"*
    start=$(date +%s%N)
    python3 -m convtune tune "$net" $bf --db "$db" --devices "$devices" > "$OUT/tune-$net-$devices.txt" \
      2> "$OUT/tune-$net-$devices.err"
    rc=$?
    end=$(date +%s%N)
    echo "$net --devices $devices: exit $rc, wall $(( (end - start) / 1000000 )) ms"
    grep -E "tuned, |per GPU" "$OUT/tune-$net-$devices.txt" "$OUT/tune-$net-$devices.err"
  done
  python3 benchmarks/compare_plans.py /tmp/devices-$net-0-1.db /tmp/devices-$net-0.db --backend cupy \
    > "$OUT/compare-$net.txt" 2>&1
  tail -3 "$OUT/compare-$net.txt"
done
