#!/usr/bin/env bash
# The 27th session's third call (carry .whl): would a row split over a thread-block cluster pay? (row_split_probe.py)
source "$(dirname "$0")/device_part.sh"
part probe 200 python3 benchmarks/row_split_probe.py
grep -s "^==" "$O/probe.log"
