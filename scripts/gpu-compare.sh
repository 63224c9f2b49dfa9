#!/usr/bin/env bash
# Runs bench_transfer and bench_step of two builds (base, new) alternately,
# two rounds, and bench_node of each once; every output under $1. For a
# change's figures against the commit before, in one run on one GPU.
#
# Here, for each of the two commits (a worktree for the older one):
#   cmake --build build-cuda --target bench_transfer bench_step bench_node kvstrand-server
# then into one pack: PACK/{base,new}/bench/{bench_transfer,bench_step,bench_node},
# PACK/{base,new}/kvstrand-server, PACK/{base,new}/lib/ (libspdlog, libfmt),
# and this script as PACK/compare.sh. There: ./compare.sh $OUT
out=${1:?out dir}
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
for round in 1 2; do
  for v in base new; do
    echo "=== $v round $round" >> "$out/transfer.log"
    timeout 150 ./$v/bench/bench_transfer --iterations 200 >> "$out/transfer.log" 2>&1
    echo "=== $v round $round" >> "$out/step.log"
    timeout 100 ./$v/bench/bench_step >> "$out/step.log" 2>&1
  done
done
for v in base new; do
  echo "=== $v" >> "$out/node.log"
  timeout 100 ./$v/bench/bench_node >> "$out/node.log" 2>&1
done
echo finished >> "$out/transfer.log"
