#!/usr/bin/env bash
# The main job: sets everything up on a fresh machine and runs the convtune CLI, e.g.
#   bash scripts/convtune.sh tune resnet18 --batch 8
# On a machine with an NVIDIA GPU, install CuPy too: CONVTUNE_EXTRAS=cuda13 bash scripts/convtune.sh ...
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh "${CONVTUNE_EXTRAS:-}"
export CONVTUNE_PROG="bash scripts/convtune.sh"  # the commands convtune suggests then run as printed
exec .venv/bin/convtune "$@"
