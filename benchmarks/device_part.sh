# Sourced by the benchmarks/gpu_*.sh device scripts: the GPU environment, the device's name, $O (the run's output
# folder: $OUT, else /tmp) and `part NAME LIMIT COMMAND...`, which runs COMMAND under a time limit into $O/NAME.log
# and prints its exit status and seconds; `gpu_tests` and `trips` (below) are parts with their summaries.
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
# `gpu_tests NAME LIMIT PYTEST_ARGS...`: the GPU tests named (pytest -m gpu on 16 workers) as a part, then its summary
gpu_tests() {
  local name=$1 limit=$2; shift 2
  part "$name" "$limit" python3 -m pytest -q -p no:cacheprovider -rfE -n 16 -m gpu "$@"
  grep -sE "[0-9]+ (passed|failed)|^(FAILED|ERROR)" "$O/$name.log" | head -30
}
# `trips NAME LIMIT ARGS...`: benchmarks/block_trips.py ARGS as a part (results in $O/NAME.json), then its summary lines
trips() {
  local name=$1 limit=$2; shift 2
  part "$name" "$limit" python3 benchmarks/block_trips.py "$@" -o "$O/$name.json"
  grep -sE "^==" "$O/$name.log"
}
