#!/usr/bin/env bash
# Host time of the block round trips' calls, warm and after the peer, with a profile (carry .whl; timeout_s 200):
#   bash benchmarks/gpu_trip_host.sh
source "$(dirname "$0")/device_part.sh"
part host 150 python3 benchmarks/trip_host_profile.py --layers replknet-dw31,hyena-long-dw
grep -sE "^==" "$O/host.log"
