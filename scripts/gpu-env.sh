# Source this on the device machine: installs the carried wheels (.whl/, see
# scripts/fetch-gpu-wheels.sh) into /tmp/site and puts them and convtune on the path.
# CuPy's compiled kernels go to $CUPY_CACHE_DIR, seeded from .gpu-carry/cupy-kernel-cache.tgz where
# an earlier call saved it (scripts/gpu-save-kernel-cache.sh; carry ".gpu-carry"): a fresh machine
# then need not compile every kernel again.
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupy-kernel-cache}
mkdir -p "$CUPY_CACHE_DIR"
if [ -f .gpu-carry/cupy-kernel-cache.tgz ]; then
  tar xzf .gpu-carry/cupy-kernel-cache.tgz -C "$CUPY_CACHE_DIR" || echo "gpu-env: the carried kernel cache did not unpack" >&2
fi
set +e
