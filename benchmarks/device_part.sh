# Sourced by the benchmarks/gpu_*.sh device scripts: the GPU environment, the device's name, $O (the run's output
# folder: $OUT, else /tmp) and `part NAME LIMIT COMMAND...`, which runs COMMAND under a time limit into $O/NAME.log
# and prints its exit status and seconds.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/gpu-env.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
O=${OUT:-/tmp}
part() {
  local name=$1 limit=$2; shift 2
  local start=$(date +%s)
  timeout "$limit" "$@" > "$O/$name.log" 2>&1
  echo "== $name (exit $?, $(( $(date +%s) - start )) s)"
}
