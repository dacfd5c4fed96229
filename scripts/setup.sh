#!/usr/bin/env bash
# Set-up shared by scripts/convtune.sh (the main job, in .venv) and scripts/test.sh (the tests, in .venv-test: the
# test set-up installs PyTorch's CPU build and the test tools, which the main job's environment does not get):
#   VENV=DIR bash scripts/setup.sh [EXTRAS]      e.g. EXTRAS "test" or "cuda13"
# makes the virtual environment where missing and installs convtune from this checkout into it, with EXTRAS; a
# checkout and extras installed before are not installed again.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VENV:-.venv}"
extras="${1:-}"
say() { echo "set-up ($venv): $*" >&2; }
quiet_pip() {  # pip, quiet, without the warnings of unreachable local indexes that some machines configure
  "$venv/bin/python" -m pip "$@" 2> >(grep -v "^WARNING: Location .* is ignored" >&2)
}
if [ ! -x "$venv/bin/python" ]; then
  say "making the virtual environment"
  python3 -m venv "$venv"
  quiet_pip install -q --upgrade pip >/dev/null
fi
# PyTorch for the tests (and the 'torch' extra): the CPU build, pinned, so that pip never pulls the
# multi-GB CUDA build onto a machine that runs the tests on its CPU (the extras then find it installed)
case ",$extras," in
  *,test,*|*,torch,*)
    if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
      say "installing PyTorch's CPU build (torch==${CONVTUNE_TORCH:-2.13.0+cpu}; about 200 MB the first time)"
      quiet_pip install -q "torch==${CONVTUNE_TORCH:-2.13.0+cpu}"
    fi ;;
esac
spec="."
[ -n "$extras" ] && spec=".[$extras]"
# what is installed: this checkout's files (as git sees them) and the extras; the same again needs no install
stamp=$( { echo "$extras"; git ls-files -s -- convtune pyproject.toml; git diff -- convtune pyproject.toml;
  git status --porcelain -- convtune pyproject.toml; } 2>/dev/null | sha256sum | cut -d' ' -f1)
if ! git rev-parse --git-dir >/dev/null 2>&1 || [ "$(cat "$venv/.convtune-stamp" 2>/dev/null)" != "$stamp" ]; then
  say "installing convtune${extras:+ with $extras} from this checkout"
  # a regular install: the main job's `convtune` is this copy; the tests (python -m pytest from the checkout's
  # root) import the checkout itself, which comes first on the path
  quiet_pip install -q "$spec"
  echo "$stamp" > "$venv/.convtune-stamp"
  [ "$venv" = .venv ] && say "done: run convtune as 'bash scripts/convtune.sh ...', or 'source .venv/bin/activate'" \
    "to have 'convtune' on your path"
fi
exit 0
