#!/usr/bin/env bash
# FFT-class layers against the torch-fft peer (issue 22) and the 3-D networks' layers against PyTorch's
# conv3d (issue 20), in one device call (carry .whl):
#   bash benchmarks/gpu_fft_class.sh
# 1. `convtune bench public-suite` on its FFT-class layers (stride 1, kernels of 7 or more per axis), every
#    peer, with floors: $OUT/bench-fft-class.json;
# 2. `convtune bench benchmarks/fft_class.yaml` (large depthwise kernels, a 16k-long 1-D layer), the same
#    peers: $OUT/bench-fft-extra.json;
#    With STAGES_LIMIT > 0 (default 0: off), also benchmarks/large_kernel_stages.yaml (RepLKNet's and
#    SLaK's later-stage depthwise layers): $OUT/bench-stages.json;
# 3. `convtune bench` of r3d-18 and unet3d-encoder (3-D), fp32: $OUT/bench-r3d-18.json, bench-unet3d.json.
# With UXNET_LIMIT > 0 (default 0: off), also uxnet3d-encoder (3-D depthwise 7x7x7: issue 20's large-kernel
# 3-D layers): $OUT/bench-uxnet3d.json; with DENSE3D_LIMIT > 0 (default 0: off), benchmarks/dense3d.yaml (dense
# 5x5x5 and 7x7x7 layers, where the GPU's rank-3 FFT variants run): $OUT/bench-dense3d.json.
# Each part has a time limit (FFT_LIMIT, EXTRA_LIMIT, R3D_LIMIT, UNET_LIMIT, UXNET_LIMIT seconds; 0 skips a part);
# the tables end each log.
cd "$(dirname "$0")/.."
source scripts/gpu-env.sh
O=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
part() {
  local name=$1 limit=$2; shift 2
  [ "$limit" = 0 ] && return
  local start=$(date +%s)
  timeout "$limit" python3 -m convtune "$@" > "$O/$name.txt" 2>&1
  echo "== $name (exit $?, $(( $(date +%s) - start )) s)"
  grep -vE "^\s+[a-z0-9_.-]+ (fwd|dgrad|wgrad|round trip|torch-fft)|leaked|nanobind|^ - " "$O/$name.txt" | tail -${TAIL:-30}
}
part bench-fft-class ${FFT_LIMIT:-400} bench public-suite --db /tmp/fft.db -o "$O/bench-fft-class.json" \
  --layers "${FFT_LAYERS:-fbfft-L2,fbfft-L4,convnext-t-dw7,dense-k13,dense-k31,hyena-long-dw}"
part bench-fft-extra ${EXTRA_LIMIT:-300} bench benchmarks/fft_class.yaml --db /tmp/fft.db -o "$O/bench-fft-extra.json"
part bench-stages ${STAGES_LIMIT:-0} bench benchmarks/large_kernel_stages.yaml --db /tmp/fft.db -o "$O/bench-stages.json"
part bench-r3d-18 ${R3D_LIMIT:-300} bench r3d-18 --db /tmp/3d.db -o "$O/bench-r3d-18.json" --no-keep-spectra
part bench-unet3d ${UNET_LIMIT:-300} bench unet3d-encoder --db /tmp/3d.db -o "$O/bench-unet3d.json" --no-keep-spectra
part bench-uxnet3d ${UXNET_LIMIT:-0} bench uxnet3d-encoder --db /tmp/3d.db -o "$O/bench-uxnet3d.json" --no-keep-spectra
part bench-dense3d ${DENSE3D_LIMIT:-0} bench benchmarks/dense3d.yaml --db /tmp/3d.db -o "$O/bench-dense3d.json" --no-keep-spectra
