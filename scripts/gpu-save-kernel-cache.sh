#!/usr/bin/env bash
# On the device machine, at the end of a call: CuPy's compiled kernels ($CUPY_CACHE_DIR, see
# scripts/gpu-env.sh) as $OUT/cupy-kernel-cache.tgz, to be copied into .gpu-carry/ here and carried
# (carry [".whl", ".gpu-carry"]) by later calls. Skipped, with a word, if it is over LIMIT_MB (default
# 40: the device tool carries 64 MiB in all, the wheels take 16).
dir=${CUPY_CACHE_DIR:-/tmp/cupy-kernel-cache}
out=${1:-${OUT:-/tmp}/cupy-kernel-cache.tgz}
[ -d "$dir" ] || { echo "no kernel cache at $dir"; exit 0; }
tar czf "$out" -C "$dir" .
mb=$(( $(stat -c %s "$out") / 1048576 ))
if [ "$mb" -gt "${LIMIT_MB:-40}" ]; then
  rm -f "$out"; echo "kernel cache: ${mb} MB, over ${LIMIT_MB:-40} MB: not saved"
else
  echo "kernel cache: $(find "$dir" -type f | wc -l) files, ${mb} MB -> $out"
fi
