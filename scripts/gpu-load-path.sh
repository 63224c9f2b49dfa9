#!/usr/bin/env bash
# The load path chosen by measurement (issue 66), checked on a GPU host:
# the probe's own copies size by size (under compute-sanitizer where they
# fail), the device runtime's and the option's tests, bench_gather (every
# geometry's paths beside the one kvstrand measured) and bench_transfer by
# the measured path and by the built-in rule.
#
# RUNS (default 1) rounds of bench_gather, bench_transfer by the measured
# path and bench_step, so the "three runs, one lease" is one
# command: RUNS=3 scripts/gpu-load-path.sh PACK OUT. With BASE (another
# pack, e.g. of the commit before a change), each round runs BASE's
# bench_transfer and bench_step beside this pack's (after it, then before
# it): the step thread and the load against that base in the same lease.
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
[[ -n $base ]] && base=$(cd "$base" && pwd)
for ((n = 1; n <= ${RUNS:-1}; n++)); do
  run "gather_$n" 150 "$pack/bench/bench_gather"
  order="new base"
  ((n % 2 == 0)) && order="base new"  # alternated: neither always runs on a warmer device
  for which in $order; do
    dir=$pack
    [[ $which == base ]] && { [[ -n $base ]] || continue; dir=$base; }
    LD_LIBRARY_PATH=$dir/lib run "transfer_${which}_$n" 120 "$dir/bench/bench_transfer" --iterations 200 --seconds 1 \
      --clients 1 --load-path measure
    LD_LIBRARY_PATH=$dir/lib run "step_${which}_$n" 90 "$dir/bench/bench_step"
  done
done
run transfer_rule 120 "$pack/bench/bench_transfer" --iterations 200 --seconds 1 --clients 1 --load-path rule
# Last, where the probe's copies failed: which size and path, and where.
if ! grep -q "All tests passed" "$out/probe_copies.txt"; then
  CUDA_LAUNCH_BLOCKING=1 run probe_copies_blocking 60 "$probe" "*each size alone" -s
  sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  [[ -n $sanitizer ]] && run sanitizer 200 "$sanitizer" --tool memcheck --print-limit 20 "$probe" "*each size alone"
fi
