#!/usr/bin/env bash
# This tree (new/) against a base commit (base/) in one lease, three rounds
# alternating which goes first: bench_step, bench_poller where packed (how
# late the strand sees a completed event), and bench_transfer with one
# client (the load embedded and through the node tier, the save), both at
# their defaults; then new/'s load path measured, and the embedded load's
# own time split (--split, awake and after 5 ms idle) of both; the GPU
# tests of new/ first, bench_gather once at the end. Each output a file
# under OUT as it ends, and OUT.tgz remade after each: a call cut off by
# its time limit still brings back everything that ended (the device tool
# returns a few files only).
#
# Here, for each of the two commits (a worktree for the older one):
#   cmake --build build-cuda --target bench_transfer bench_step bench_poller kvstrand-server
#   (new/ also bench_gather test_device_runtime test_connector_load_path)
# then one pack: PACK/{base,new}/{bench,tests}/..., PACK/{base,new}/kvstrand-server,
# PACK/{base,new}/lib/ (libspdlog, libfmt) and this script. There:
#   cd PACK && ./gpu-compare.sh $OUT/r [ROUNDS]   (results in $OUT/r.tgz)
set -u
out=${1:?usage: gpu-compare.sh OUT [ROUNDS]}; rounds=${2:-3}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv >"$out/gpu.txt" 2>&1
run() {  # name limit pack cmd...
  local name=$1 limit=$2 pack=$3; shift 3
  local t0=$SECONDS
  LD_LIBRARY_PATH=$PWD/$pack/lib timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  echo "exit $? after $((SECONDS - t0)) s" >>"$out/$name.txt"
  echo "$name: $(tail -1 "$out/$name.txt")"
  tar -czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
}
run device_runtime 90 new new/tests/test_device_runtime
run connector_load_path 60 new new/tests/test_connector_load_path
for ((n = 1; n <= rounds; n++)); do
  order="new base"; ((n % 2 == 0)) && order="base new"
  for w in $order; do
    run "step_${w}_$n" 60 "$w" "$w/bench/bench_step"
    [[ -x $w/bench/bench_poller ]] && run "poller_${w}_$n" 60 "$w" "$w/bench/bench_poller" 300
    run "transfer_${w}_$n" 60 "$w" "$w/bench/bench_transfer" --iterations 200 --seconds 1 --clients 1
  done
  run "transfer_measure_new_$n" 60 new new/bench/bench_transfer --iterations 200 --seconds 1 --clients 1 --load-path measure
  for w in $order; do
    for idle in 0 5; do
      run "split_${w}_idle${idle}_$n" 60 "$w" "$w/bench/bench_transfer" --iterations 200 --no-server --clients 1 \
        --split --idle-ms "$idle"
    done
  done
done
run gather 60 new new/bench/bench_gather
