#!/usr/bin/env bash
# Why long-16k-dw's row kernels stay about 3x above their traffic floor, before building a cluster split for them
# (1024-thread blocks gave only 6%, so occupancy may not be what limits them). ncu profiles the first launch of each
# trip kernel of the 1024-thread, radix-8 trip (carry .whl; timeout_s 300):
#   bash benchmarks/gpu_profile_long_rows.sh
source "$(dirname "$0")/device_part.sh"
for k in rowfft_fwd_keep rowfft_dgrad_keep rowfft_wgrad_from rowfft_rows_spectrum; do
  part "ncu-$k" 70 ncu --clock-control none -k "regex:^$k\$" -c 1 --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    --section WarpStateStats python3 benchmarks/block_trips.py --layers long-16k-dw \
    --only "sizes=32768,block,threads=1024]" --repeats 3 --side-by-side 0
  grep -sE "Duration|Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Stall|Bank" "$O/ncu-$k.log" | head -24
done
