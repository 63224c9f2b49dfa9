#!/usr/bin/env bash
# The goal column (docs/PERFORMANCE.md, Current figures) in one command on the GPU machine, three runs of
# each, so that every figure comes from one host (the H200 leases differ a
# lot from one another: compare only within one):
# - bench_step: the step thread's time above baseline;
# - bench_transfer --iterations 200 --seconds 1: the scattered load against
#   one contiguous copy (embedded, through the node tier, the batch alone),
#   and saves from 1, 2, 4 and 8 processes against one;
# - bench_transfer --no-server --clients 1 --split, with --idle-ms 0 and 5:
#   the embedded load's time until its copies are queued, when the lookup
#   before it finds the reactor awake (within the idle spin of the last
#   load) and when it finds it asleep (5 ms idle first): whether a lookup
#   should keep the reactor spinning as a submit does;
# - bench_python (gpu-python.sh --bench-only builds the module there):
#   finished() with nothing to drain against a no-op call.
# - bench_gather: every gather path against one contiguous copy, per
#   segment size and for engines' paged layouts, with the SMs' floor (the
#   kernel copying one contiguous range) and the SMs and copy engines at
#   once (a range split between them; a gather whose largest segments go
#   by the DMA batch beside the kernel) in the same run;
# - bench_chunk_keys: chunk keys for 131,072 tokens against one-shot hashing.
# Writes goal.log (every benchmark's whole output), goal.txt (the lines the
# column is read from) and bench_python.txt into RESULTS.
#
#   cd .gpu-pack && ./gpu-goal.sh . $OUT
set -uo pipefail
pack=$(cd "${1:?usage: gpu-goal.sh PACK RESULTS}" && pwd)
results=$(mkdir -p "${2:?usage: gpu-goal.sh PACK RESULTS}" && cd "$2" && pwd)
log=$results/goal.log
sum=$results/goal.txt
: >"$log"
{
  echo "host: $(hostname), $(date -u +%FT%TZ), $(nproc) CPUs"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
} | tee "$sum"
status=0
# $1: the summary's label; $2: how many last lines are the figures; the rest: the command.
bench() {
  local label=$1 lines=$2
  shift 2
  echo "=== $label: $*" | tee -a "$sum" >>"$log"
  "$@" >"$results/one.log" 2>&1
  local rc=$?
  if [[ $rc != 0 ]]; then
    status=1
    echo "  (exit $rc)" | tee -a "$sum"
  fi
  cat "$results/one.log" >>"$log"
  tail -n "$lines" "$results/one.log" | tee -a "$sum"
  rm -f "$results/one.log"
}
for run in 1 2 3; do
  bench "run $run" 6 "$pack/bench/bench_step"
  bench "run $run" 13 "$pack/bench/bench_transfer" --iterations 200 --seconds 1
  for idle in 0 5; do
    bench "run $run, split, idle before each lookup $idle ms" 7 "$pack/bench/bench_transfer" --iterations 200 \
      --no-server --clients 1 --split --idle-ms $idle
  done
  bench "run $run" 200 "$pack/bench/bench_gather"
  bench "run $run" 2 "$pack/bench/bench_chunk_keys"
done
echo "=== bench_python (three runs)" | tee -a "$sum"
"$pack/gpu-python.sh" "$pack" "$results" --bench-only >>"$log" 2>&1 || status=1
tee -a "$sum" <"$results/bench_python.txt"
echo "gpu-goal: $([[ $status == 0 ]] && echo done || echo 'a benchmark FAILED (goal.log)')" | tee -a "$sum"
exit $status
