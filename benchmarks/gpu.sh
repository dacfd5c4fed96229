#!/usr/bin/env bash
# The benchmarks of BENCHMARKS.md on a machine with an NVIDIA GPU, CuPy and PyTorch, one part per argument:
#
#   bash benchmarks/gpu.sh PART [PART ...]
#
#   tests              every GPU test (scripts/gpu-tests-parallel.sh)
#   suite[:MATH]       `convtune bench` on the public layer suite (../shared/bench/layers.yaml or $SUITE), MATH fp32
#                      (default) or tf32, against PyTorch (fp32, TF32) and the best cuDNN engine
#   half               the same in bfloat16 channels_last, tf32 math (PyTorch's defaults under AMP)
#   depthwise-half     `convtune bench` on benchmarks/depthwise_half.yaml in bfloat16 channels_last (ConvNeXt-T's 7x7
#                      depthwise layers, 3x3 and 5x5 ones) against PyTorch
#   depthwise-vec[:PASSES] benchmarks/depthwise_vec.py: the vectorized and staged channels-last depthwise kernels'
#                      configurations swept on those layers and MobileNetV3-Large's strided ones (PASSES
#                      comma-separated, default fwd,dgrad,wgrad), beside PyTorch's call
#   fft-class          `convtune bench` on benchmarks/fft_class.yaml, round trips against the torch.fft recipe
#   trips              benchmarks/block_trips.py: the large depthwise layers' round trips against torch.fft, paired
#   dense-trips        the same for the dense layers (benchmarks/block_trips.py --all: every trip candidate)
#   narrow-blocks      benchmarks/narrow_blocks.py: the narrow product's blocks per pass, its own against others
#   host[:NAME[:BATCH]] benchmarks/torch_overhead.py: host time per call of the drop-in against PyTorch (default
#                      ResNet-50, batch 32; STRATEGIES=S,... in the environment: those strategies' plans only)
#   model:NAME[:BATCH] `convtune bench-model NAME` (fp32 and AMP, eager, fresh cache, PyTorch against itself too)
#   graph:NAME[:BATCH] the same with whole training steps captured in CUDA graphs
#   kept:NAME[:BATCH]  `convtune bench-model NAME` in fp32: per-pass plans (the default) against kept spectra where
#                      they pay (convtune-fp32-kept: the trip verdicts and their duels in the layer), three rounds,
#                      PyTorch against itself
#   tune:NAME[:BATCH]  `convtune tune NAME` from an empty cache in fp32, then in bfloat16 channels_last (AMP's
#                      problems): each prints where its time went; the caches are kept as tune-NAME-DTYPE.db, one
#                      file each, for benchmarks/check_rules.py and replay_cudnn_rules.py
#   profile:NAME[:BATCH] `convtune bench-model NAME` under AMP (PyTorch's and convtune's, three rounds, PyTorch
#                      against itself) with five more steps each under torch.profiler: the device's busy time per
#                      step, the operations that take most host time and the drop-in's own (in the JSON)
#   regret:NAME[:BATCH] the regret of a normal tune: NAME tuned --exhaustive into its own cache, then `convtune
#                      bench-model NAME` in fp32 with each convtune mode also run on the exhaustive plans (--against),
#                      interleaved over three rounds, PyTorch against itself for the noise; then layer by layer
#                      (benchmarks/compare_plans.py: the two caches' winners re-timed side by side, A/A' the noise)
#   tune-ahead:NAME[:BATCH] the drop-in's tune-ahead under AMP (`convtune bench-model NAME --modes
#                      convtune-amp-bf16`, its mode alone): from an empty plan cache; then on plans `convtune tune`
#                      stored (bfloat16 channels_last) in a process of its own, the model's first tune-ahead there;
#                      then again in another process, which reads the weighed steps the first stored. Each says where
#                      its time went
# (NAME as the model specs take it, e.g. timm:convnext_tiny; a last field of digits is the batch)
#
# Each part runs under a time limit (LIMIT seconds, default 540) into $LOG_DIR/PART.log (default ./gpu-results),
# and its JSON results beside it; the script prints each part's exit status, seconds and last lines.
# Without network access, fetch the wheels first (scripts/offline-wheels.sh).
set -u
cd "$(dirname "$0")/.."
[ -d .whl ] && source scripts/offline-env.sh
O=${LOG_DIR:-$PWD/gpu-results}
mkdir -p "$O"
SUITE=${SUITE:-../shared/bench/layers.yaml}
LIMIT=${LIMIT:-540}
DB="$O/plans.db"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__, 'cudnn', torch.backends.cudnn.version())"
git rev-parse --short HEAD 2>/dev/null

run() {  # run NAME COMMAND...: COMMAND under the limit into $O/NAME.log, then its status and last lines
  local name=$1 start
  shift
  start=$(date +%s)
  timeout "$LIMIT" "$@" > "$O/$name.log" 2>&1
  echo "== $name (exit $?, $(( $(date +%s) - start )) s)"
  grep -vE "leaked|nanobind|See https" "$O/$name.log" | tail -12 | cut -c1-220
}

for part in "$@"; do
  kind=${part%%:*} arg="" batch=""
  [ "$kind" != "$part" ] && arg=${part#*:}
  if [[ "$arg" =~ ^(.*):([0-9]+)$ ]]; then arg=${BASH_REMATCH[1]} batch=${BASH_REMATCH[2]}; fi
  case "$kind" in
    tests) LOG_DIR=$O LIMIT=$LIMIT bash scripts/gpu-tests-parallel.sh ;;
    suite) run "suite-${arg:-fp32}" python3 -m convtune bench "$SUITE" --math "${arg:-fp32}" --db "$DB" \
             -o "$O/suite-${arg:-fp32}.json" ;;
    half) run half python3 -m convtune bench "$SUITE" --math tf32 --dtype bfloat16 --layout channels_last --db "$DB" \
            -o "$O/half.json" ;;
    depthwise-half) run depthwise-half python3 -m convtune bench benchmarks/depthwise_half.yaml --math tf32 \
                      --dtype bfloat16 --layout channels_last --db "$O/depthwise-half.db" -o "$O/depthwise-half.json" ;;
    depthwise-vec) run depthwise-vec python3 benchmarks/depthwise_vec.py --passes "${arg:-fwd,dgrad,wgrad}" \
                     -o "$O/depthwise-vec.json" ;;
    fft-class) run fft-class python3 -m convtune bench benchmarks/fft_class.yaml --db "$DB" -o "$O/fft-class.json" ;;
    trips) run trips python3 benchmarks/block_trips.py -o "$O/trips.json" ;;
    dense-trips) run dense-trips python3 benchmarks/block_trips.py --all \
                   --layers dense-k31,dense-k25-p128-c32,dense-k27-p96-c48,dense-k35-p256-c16,fbfft-L1 \
                   -o "$O/dense-trips.json" ;;
    narrow-blocks) run narrow-blocks python3 benchmarks/narrow_blocks.py -o "$O/narrow-blocks.json" ;;
    host) name="host${arg:+-${arg//[^A-Za-z0-9_-]/_}}${STRATEGIES:+-${STRATEGIES//,/_}}"
          run "$name" python3 benchmarks/torch_overhead.py "${arg:-torchvision:resnet50}" --batch "${batch:-32}" \
            ${STRATEGIES:+--strategies "$STRATEGIES"} --db "$DB" -o "$O/$name.json" ;;
    model|graph)
      flags="--rounds 3 --null"; [ "$kind" = graph ] && flags="--graph --rounds 3 --null"
      run "$kind-${arg//[^A-Za-z0-9_-]/_}" python3 -m convtune bench-model "$arg" $flags --batch "${batch:-16}" \
        --modes torch-fp32,convtune-fp32,torch-amp-bf16,convtune-amp-bf16 --db "$O/$kind-model.db" \
        -o "$O/$kind-${arg//[^A-Za-z0-9_-]/_}.json" ;;
    kept)
      run "kept-${arg//[^A-Za-z0-9_-]/_}" python3 -m convtune bench-model "$arg" --rounds 3 --null --batch "${batch:-16}" \
        --modes torch-fp32,convtune-fp32,convtune-fp32-kept --db "$O/kept-model.db" \
        -o "$O/kept-${arg//[^A-Za-z0-9_-]/_}.json" ;;
    regret)
      name=${arg//[^A-Za-z0-9_-]/_}
      run "exhaustive-$name" python3 -m convtune tune "$arg" --batch "${batch:-16}" --exhaustive --db "$O/exhaustive-$name.db"
      run "regret-$name" python3 -m convtune bench-model "$arg" --rounds 3 --null --batch "${batch:-16}" \
        --modes torch-fp32,convtune-fp32 --against "$O/exhaustive-$name.db" --db "$O/regret-$name.db" \
        -o "$O/regret-$name.json"
      run "regret-layers-$name" python3 benchmarks/compare_plans.py "$O/regret-$name.db" "$O/exhaustive-$name.db" \
        --backend cupy --rounds 5 ;;
    tune)
      name=${arg//[^A-Za-z0-9_-]/_}
      for dtype in float32 bfloat16; do
        layout=channels_first; [ "$dtype" = bfloat16 ] && layout=channels_last
        rm -f "/tmp/tune-$name-$dtype.db"*
        run "tune-$name-$dtype" python3 -m convtune tune "$arg" --batch "${batch:-16}" --dtype "$dtype" \
          --layout "$layout" --db "/tmp/tune-$name-$dtype.db"
        # one file (no -wal/-shm beside it) in the results directory
        python3 -c "import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))" \
          "/tmp/tune-$name-$dtype.db" "$O/tune-$name-$dtype.db"
      done ;;
    tune-ahead)
      name=${arg//[^A-Za-z0-9_-]/_} ahead="--modes convtune-amp-bf16 --rounds 1 --steps 5 --warmup 1"
      rm -f "/tmp/ahead-$name-"*.db*
      run "tune-ahead-$name-empty" python3 -m convtune bench-model "$arg" --batch "${batch:-16}" $ahead \
        --db "/tmp/ahead-$name-empty.db" -o "$O/tune-ahead-$name-empty.json"
      run "tune-ahead-$name-plans" python3 -m convtune tune "$arg" --batch "${batch:-16}" --dtype bfloat16 \
        --layout channels_last --db "/tmp/ahead-$name-cached.db"
      for turn in first later; do
        run "tune-ahead-$name-cached-$turn" python3 -m convtune bench-model "$arg" --batch "${batch:-16}" $ahead \
          --db "/tmp/ahead-$name-cached.db" -o "$O/tune-ahead-$name-cached-$turn.json"
      done ;;
    profile)
      name=${arg//[^A-Za-z0-9_-]/_}
      run "profile-$name" python3 -m convtune bench-model "$arg" --rounds 3 --null --batch "${batch:-16}" \
        --modes torch-amp-bf16,convtune-amp-bf16 --profile-steps 5 --db "$O/profile-model.db" -o "$O/profile-$name.json"
      [ -f "$O/profile-$name.json" ] && python3 - "$O/profile-$name.json" <<'PY'
import json, sys
for m in json.load(open(sys.argv[1]))["modes"]:
    prof = m.get("profile")
    if not prof:
        continue
    print(f"{m['mode']}: {prof['wall_ms_per_step']:.2f} ms per profiled step, device busy {prof['device_busy_ms_per_step']}"
          f" ms; the drop-in's functions {prof['drop_in_functions']}")
    for op in prof["host_top"][:8]:
        print(f"   host {op['ms_per_step']:7.3f} ms per step  {op['calls_per_step']:7.1f} calls  {op['name'][:90]}")
PY
      ;;
    *) echo "unknown part '$part'; parts: tests suite[:fp32|tf32] half depthwise-half depthwise-vec[:PASSES] fft-class trips dense-trips narrow-blocks host[:NAME[:BATCH]] model:NAME[:BATCH]" \
         "graph:NAME[:BATCH] kept:NAME[:BATCH] tune:NAME[:BATCH] tune-ahead:NAME[:BATCH] profile:NAME[:BATCH]" \
         "regret:NAME[:BATCH]" >&2; exit 2 ;;
  esac
done
