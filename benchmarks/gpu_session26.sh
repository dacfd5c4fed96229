#!/usr/bin/env bash
# The 26th session's first measuring call (carry .whl; timeout_s 600):
#   bash benchmarks/gpu_session26.sh
# 1. ncu on long-16k-dw's trip kernels (the 1024-thread radix-8 trip, the best one; one profiling run, all four
#    kernels): why they run about 3x above their traffic floor, before anything is built for them;
# 2. convtune bench of the dense FFT-class layers of the public suite and convnext-t-dw7 against the torch-fft peer
#    (issue 22: fbfft-L2 and dense-k31 keep >= 2.8x; no layer slower).
source "$(dirname "$0")/device_part.sh"
part ncu-long 200 ncu --clock-control none -k "regex:^rowfft_(fwd_keep|dgrad_keep|wgrad_from|rows_spectrum)\$" -c 4 \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section InstructionStats \
  python3 benchmarks/block_trips.py --layers long-16k-dw --only "sizes=32768,block,threads=1024]" --repeats 3 \
  --side-by-side 0
grep -sE "^  rowfft|Duration|Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Stall|Bank|Eligible" \
  "$O/ncu-long.log" | head -80
part bench-dense 330 python3 -m convtune bench public-suite --layers fbfft-L2,dense-k31,dense-k13,fbfft-L4,convnext-t-dw7 \
  --time-budget 2 --db /tmp/dense.db -o "$O/bench-dense.json"
grep -sE "^(fbfft|dense|convnext)|fft-trip|within" "$O/bench-dense.log"
