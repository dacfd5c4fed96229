# Source this on a GPU machine without network access, in the checkout: installs the wheels of .whl/
# (see scripts/offline-wheels.sh) into /tmp/site and puts them and this checkout's convtune on the path.
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
set +e
