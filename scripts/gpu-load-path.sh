#!/usr/bin/env bash
# The load path chosen by measurement (issue 66), checked on a GPU host:
# the probe's own copies size by size (under compute-sanitizer where they
# fail), the device runtime's and the option's tests, bench_gather (every
# geometry's paths beside the one kvstrand measured) and bench_transfer by
# the measured path and by the built-in rule.
#
# RUNS (default 1): bench_gather, bench_transfer by the measured path and
# bench_step that many times, so the "three runs, one lease" is one
# command: RUNS=3 scripts/gpu-load-path.sh PACK OUT.
#
# With BASE (another pack, e.g. of b4cfd90), bench_step and bench_transfer
# of both, alternating, twice: the step thread, the load and the saves
# against that base in the same lease.
#
#   scripts/gpu-load-path.sh PACK OUT [BASE]    (packs unpacked)
set -uo pipefail
pack=$(cd "${1:?usage: gpu-load-path.sh PACK OUT [BASE]}" && pwd)
out=${2:?usage: gpu-load-path.sh PACK OUT [BASE]}
base=${3:-}
mkdir -p "$out"
export LD_LIBRARY_PATH=$pack/lib
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >"$out/gpu.txt" 2>&1
cat "$out/gpu.txt"
run() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  echo "=== $name: $*"
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  echo "exit $? after $((SECONDS - t0)) s" | tee -a "$out/$name.txt"
  tail -4 "$out/$name.txt" | head -3
}
probe="$pack/tests/test_load_path"
run probe_copies 120 "$probe" "*each size alone"
run device_runtime 120 "$pack/tests/test_device_runtime"
run connector_load_path 60 "$pack/tests/test_connector_load_path"
run gather 150 "$pack/bench/bench_gather"
for path in measure rule; do
  run "transfer_$path" 120 "$pack/bench/bench_transfer" --iterations 200 --seconds 1 --clients 1 --load-path "$path"
done
run step 90 "$pack/bench/bench_step"
for ((n = 2; n <= ${RUNS:-1}; n++)); do
  run "gather_$n" 150 "$pack/bench/bench_gather"
  run "transfer_measure_$n" 120 "$pack/bench/bench_transfer" --iterations 200 --seconds 1 --clients 1 --load-path measure
  run "step_$n" 90 "$pack/bench/bench_step"
done
if [[ -n $base ]]; then
  base=$(cd "$base" && pwd)
  for run in 1 2; do
    for which in base new; do
      dir=$pack
      [[ $which == base ]] && dir=$base
      LD_LIBRARY_PATH=$dir/lib run "step_${which}_$run" 90 "$dir/bench/bench_step"
      LD_LIBRARY_PATH=$dir/lib run "transfer_${which}_$run" 120 "$dir/bench/bench_transfer" --iterations 200 --seconds 1 --clients 1,2
    done
  done
fi
# Last, where the probe's copies failed: which size and path, and where.
if ! grep -q "All tests passed" "$out/probe_copies.txt"; then
  CUDA_LAUNCH_BLOCKING=1 run probe_copies_blocking 60 "$probe" "*each size alone" -s
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  [[ -n $sanitizer ]] && run sanitizer 200 "$sanitizer" --tool memcheck --print-limit 20 "$probe" "*each size alone"
fi
