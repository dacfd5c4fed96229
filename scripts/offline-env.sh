# Source this on a GPU machine without network access, in the checkout: installs the wheels of .whl/
# (see scripts/offline-wheels.sh) into /tmp/site and puts them and this checkout's convtune on the path.
# The wheels and the checkout are compiled to byte code here, as a user's install is: without it a profiled tune on
# an H200 compiled 1,927 modules on import (6.2 s; the cuDNN frontend's among them, counted in its first listing).
set -e
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
python3 -m compileall -q -j 0 convtune > /dev/null || true
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
set +e
