# Source this on the device machine: installs the carried wheels (.whl/, see
# scripts/fetch-gpu-wheels.sh) into /tmp/site and puts them and convtune on the path.
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
set +e
