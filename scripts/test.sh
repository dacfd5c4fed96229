#!/usr/bin/env bash
# The test command: sets everything up on a fresh machine and runs the test suite.
#   bash scripts/test.sh [pytest args]
# Installs Debian's postgresql when its server binaries are missing (the PostgreSQL cache
# tests start a throwaway server on loopback), then convtune with its test extra; checks the code with ruff and
# the import layers with import-linter (pyproject.toml holds both configurations), then runs pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/postgres.sh
VENV=.venv-test bash scripts/setup.sh test
echo "checking the code (ruff) and the import layers (import-linter)" >&2
.venv-test/bin/ruff check --quiet .
.venv-test/bin/lint-imports --no-cache >/dev/null || { .venv-test/bin/lint-imports --no-cache; exit 1; }
set +e
.venv-test/bin/python -m pytest -q "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
  echo "pytest collected no tests" >&2
  exit 0
fi
exit "$rc"
