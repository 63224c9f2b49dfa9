#!/usr/bin/env bash
# Runs, on the GPU machine, everything a packed cuda build holds: the whole
# test suite ([gpu] cases included), the benchmarks (bench_node over every
# visible GPU, one client process per GPU), a cross-GPU check (with two or
# more GPUs: a client on GPU 0 and one on GPU 1 each load, byte for byte,
# what the other stored) and the engine demo (alone, then through a server).
# Writes tests.log (every test binary's output), bench.log (every
# benchmark's output), cross-gpu.log,
# demo.log (the engine demo's table, then kvstrand-move-chunk),
# demo-server.log (the demo's tier arms, the fit arms and tier-restart through
# one kvstrand-server), engine-demo.json and summary.txt into RESULTS
# (default: $OUT, else ./gpu-results): 7 files; the device tool brings back 8.
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
: >"$results/bench.log"
for bench in "bench_poller 1000" "bench_chunk_keys" "bench_step" "bench_transfer --iterations 200" "bench_node"; do
  name=${bench%% *}
  # shellcheck disable=SC2086
  "$build"/bench/$bench >"$results/one.log" 2>&1 || failed=1
  { echo "=== $bench"; cat "$results/one.log"; } >>"$results/bench.log"
  # the figures are the last lines
  lines=1; [[ $name == bench_transfer ]] && lines=11; [[ $name == bench_step ]] && lines=6
  [[ $name == bench_node ]] && lines=12
  tail -n $lines "$results/one.log" | tee -a "$summary"
  rm -f "$results/one.log"
done
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [[ $gpus -ge 2 ]]; then
  sock=/tmp/kvstrand-cross-gpu.sock
  "$build"/kvstrand-server --socket $sock --tier-bytes 8G --chunk-tokens 64 --log-level warn &
  server=$!
  sleep 1
  pids=()
  for i in 0 1; do
    CUDA_VISIBLE_DEVICES=$i "$build"/tests/kvstrand-tier-client --socket $sock --id $i --peers 2 --rounds 6 \
      >"$results/client$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  rc=0
  for i in 0 1; do grep -q "mismatches 0" "$results/client$i.log" || rc=1; done
  kill $server; wait $server 2>/dev/null
  { echo "=== GPU 0 client"; cat "$results/client0.log"; echo "=== GPU 1 client"; cat "$results/client1.log"; } \
    >"$results/cross-gpu.log"
  rm -f "$results"/client?.log
  echo "cross-GPU (a client on each of GPU 0 and 1 loads what the other stored): $([[ $rc -eq 0 ]] && echo exact || echo FAILED)" |
    tee -a "$summary"
  tail -n 2 "$results/cross-gpu.log" | tee -a "$summary"
  [[ $rc -eq 0 ]] || failed=1
fi
demo_out=$(mktemp -d)
"$build"/examples/engine/kvstrand-engine-demo --out "$demo_out" >"$results/demo.log" 2>&1 || failed=1
cp "$demo_out/engine-demo.json" "$results/" 2>/dev/null
grep -E "^(arm|none|hbm|tier|resumed)" "$results/demo.log" | tee -a "$summary"
"$build"/examples/kvstrand-move-chunk --rounds 5 >>"$results/demo.log" 2>&1 || failed=1
tail -1 "$results/demo.log" | tee -a "$summary"
# The demo through one kvstrand-server: the tier arms warm it, then the fit
# arms run on that warm server, and tier-restart starts a fresh engine on it.
sock=/tmp/kvstrand-demo-server.sock
"$build"/kvstrand-server --socket $sock --tier-bytes 8G --log-level warn &
server=$!
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
"$build"/examples/engine/kvstrand-engine-demo --server $sock --arms tier,tier+spec,hbm-fit,tier-fit,tier-restart \
  --out "$demo_out" >"$results/demo-server.log" 2>&1 || failed=1
kill $server; wait $server 2>/dev/null
echo "demo through kvstrand-server:" | tee -a "$summary"
grep -E "^(arm|hbm|tier|resumed)" "$results/demo-server.log" | tee -a "$summary"
exit $failed
