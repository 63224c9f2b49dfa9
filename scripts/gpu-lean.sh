#!/usr/bin/env bash
# Issue 66 in one short lease (gpu-load-path.sh without the probe's tests,
# for a lease with little device time left): the load-path test, then
# rounds of bench_step and bench_transfer (measured path) of new/ and base/
# alternating, and bench_gather; each output a file under OUT as it ends.
#
#   cd .gpu-pack && ./gpu-lean.sh OUT [ROUNDS]    (new/ and base/: two unpacked packs)
set -u
out=$1; rounds=${2:-2}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >"$out/gpu.txt" 2>&1
run() {  # name limit pack cmd...
  local name=$1 limit=$2 pack=$3; shift 3
  local t0=$SECONDS
  LD_LIBRARY_PATH=$PWD/$pack/lib timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  echo "exit $? after $((SECONDS - t0)) s" >>"$out/$name.txt"
  echo "$name: $(tail -1 "$out/$name.txt")"
}
run connector_load_path 60 new new/tests/test_connector_load_path
for ((n = 1; n <= rounds; n++)); do
  order="new base"; ((n % 2 == 0)) && order="base new"
  for w in $order; do
    run "step_${w}_$n" 90 "$w" "$w/bench/bench_step"
    run "transfer_${w}_$n" 90 "$w" "$w/bench/bench_transfer" --iterations 200 --seconds 1 --clients 1 --load-path measure
  done
  run "gather_$n" 120 new new/bench/bench_gather
done
