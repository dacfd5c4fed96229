#!/usr/bin/env bash
# The soak test of a shared plan cache (tests/soak.py says what it runs and reports), in the test environment:
#   bash scripts/soak.sh --store postgresql --tuners 32 --readers 128 --minutes 10 [--out report.json]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/postgres.sh
VENV=.venv-test bash scripts/setup.sh test
exec .venv-test/bin/python tests/soak.py "$@"
