#!/usr/bin/env bash
# Runs, on the GPU machine, everything a packed cuda build holds: the whole
# test suite ([gpu] cases included), the benchmarks and the engine demo.
# Writes tests.log (every test binary's output), one log per benchmark,
# demo.log (the engine demo's table, then kvstrand-move-chunk),
# engine-demo.json and summary.txt into RESULTS (default: $OUT, else
# ./gpu-results): 8 files, what the device tool brings back.
#
#   ./gpu-run.sh . [RESULTS]            in a pack from scripts/gpu-pack.sh
#   scripts/gpu-run.sh build-cuda [RESULTS]
set -uo pipefail
build=${1:?usage: gpu-run.sh BUILD_DIR [RESULTS]}
results=${2:-${OUT:-gpu-results}}
mkdir -p "$results"
summary=$results/summary.txt
: >"$summary"
: >"$results/tests.log"
{
  echo "host: $(hostname), $(date -u +%FT%TZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "nvidia-smi: none"
} >>"$summary"

failed=0
for t in "$build"/tests/test_*; do
  [[ -x $t ]] || continue
  name=$(basename "$t")
  "$t" --reporter console --durations no >"$results/one.log" 2>&1
  rc=$?
  line=$(grep -E "^(All tests passed|test cases:)" "$results/one.log" | tail -1)
  warnings=$(grep -c "skipped:" "$results/one.log")
  { echo "=== $name (rc=$rc)"; cat "$results/one.log"; } >>"$results/tests.log"
  rm -f "$results/one.log"
  echo "$name: rc=$rc $line (skip warnings: $warnings)" | tee -a "$summary"
  [[ $rc -eq 0 ]] || failed=1
done
for bench in "bench_poller 1000" "bench_chunk_keys" "bench_step" "bench_transfer --iterations 200"; do
  name=${bench%% *}
  # shellcheck disable=SC2086
  "$build"/bench/$bench >"$results/$name.log" 2>&1 || failed=1
  # bench_transfer's and bench_step's figures are their last lines
  lines=1; [[ $name == bench_transfer ]] && lines=11; [[ $name == bench_step ]] && lines=3
  tail -n $lines "$results/$name.log" | tee -a "$summary"
done
demo_out=$(mktemp -d)
"$build"/examples/engine/kvstrand-engine-demo --out "$demo_out" >"$results/demo.log" 2>&1 || failed=1
cp "$demo_out/engine-demo.json" "$results/" 2>/dev/null
grep -E "^(arm|none|hbm|tier|resumed)" "$results/demo.log" | tee -a "$summary"
"$build"/examples/kvstrand-move-chunk --rounds 5 >>"$results/demo.log" 2>&1 || failed=1
tail -1 "$results/demo.log" | tee -a "$summary"
exit $failed
