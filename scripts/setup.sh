#!/usr/bin/env bash
# Set-up shared by scripts/test.sh and scripts/convtune.sh: a virtual environment in .venv
# with convtune installed from this checkout (extras given as arguments, e.g. "test" or "test,torch").
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# PyTorch for the tests (and the 'torch' extra): the CPU build, pinned, so that pip never pulls the
# multi-GB CUDA build onto a machine that runs the tests on its CPU (the extras then find it installed)
case ",$extras," in
  *,test,*|*,torch,*)
    .venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/python -m pip install -q "torch==${CONVTUNE_TORCH:-2.13.0+cpu}" ;;
esac
spec="."
[ -n "$extras" ] && spec=".[$extras]"
# a regular install, made anew from the checkout at every set-up: the main job's `convtune` is this copy, and
# the tests (python -m pytest from the checkout's root) import the checkout itself, which comes first on the path
# (an editable install would do the same and print setuptools' warnings about its modes at every set-up)
.venv/bin/python -m pip install -q "$spec"
