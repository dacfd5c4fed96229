#!/usr/bin/env bash
# For a GPU machine without network access that has Python 3.12, CuPy and PyTorch but not the rest of
# convtune's needs: downloads, on a machine with network access, the cp312 wheels it lacks into .whl/
# (ignored by git). Copy the checkout with .whl/ to the GPU machine and `source scripts/offline-env.sh` there.
# The cuDNN frontend installs with --no-deps: it works without its optional CUTLASS/TVM extras;
# pytest-xdist lets scripts/gpu-tests-parallel.sh spread the GPU tests.
set -euo pipefail
cd "$(dirname "$0")/.."
platforms=(--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
for req in "sqlalchemy==2.1.9" "nvidia-cudnn-frontend==1.32.0" "pytest-xdist==3.8.0" "execnet==2.1.1"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl "$req"
done
ls -l .whl
