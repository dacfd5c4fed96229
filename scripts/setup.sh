#!/usr/bin/env bash
# Set-up shared by scripts/test.sh and scripts/convtune.sh: a virtual environment in .venv
# with convtune installed from this checkout (extras given as arguments, e.g. "test").
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
spec="."
[ -n "$extras" ] && spec=".[$extras]"
.venv/bin/python -m pip install -q -e "$spec"
