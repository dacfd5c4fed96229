#!/usr/bin/env bash
# Waits up to SECONDS for benchmarks/gpu_torch_pipeline.sh to finish, then packs what it wrote so far
# into $OUT/torch-results.tar.gz and shows its log (run it as the next device call, within the 30 s
# the machine stays warm):  bash benchmarks/gpu_torch_poll.sh 540
R=${2:-/tmp/convtune-torch-results}
end=$(( $(date +%s) + ${1:-540} ))
while [ "$(date +%s)" -lt "$end" ] && ! grep -q "] done" "$R/pipeline.log" 2>/dev/null; do sleep 5; done
cat "$R/pipeline.log" 2>/dev/null
current=$(ls -t "$R"/*.out 2>/dev/null | head -1)
[ -n "$current" ] && { echo "== tail of $current"; tail -15 "$current"; }
tar -czf "${OUT:-/tmp}/torch-results.tar.gz" -C "$R" . 2>/dev/null
ls -l "${OUT:-/tmp}/torch-results.tar.gz"
