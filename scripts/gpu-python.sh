#!/usr/bin/env bash
# On the GPU machine: builds the Python module there, against that
# machine's python3 (its headers; pybind11's come in the pack) and the
# pack's libkvstrand.so, then runs the device-neutral Python tests
# (test_module, test_stubs, test_vllm* against the newest and the oldest
# picture of vLLM: the sim-hook cases skip; test_vllm_torch
# on torch CUDA tensors, where that machine's torch has a GPU; test_sglang
# against both pictures of SGLang, test_sglang_torch), the
# example engine loop (embedded tier, then twice on a kvstrand-server of its
# own), bench_python and bench_sglang. The repository is the pack's parent directory.
# --bench-only: builds the module and runs bench_python alone, three times
# (the figures for a run with the other benchmarks, where the tests ran
# before: gpu-goal.sh).
#
#   cd .gpu-pack && ./gpu-python.sh . $OUT [--bench-only | --tests "FILE..." [PYTEST_ARGS]]
set -uo pipefail
pack=$(cd "${1:-.}" && pwd)
out=$(mkdir -p "${2:-$pack/out}" && cd "${2:-$pack/out}" && pwd)
src=$(cd "$pack/.." && pwd)
py=python3
inc=$($py -c "import sysconfig; print(sysconfig.get_paths()['include'])")
ext=$($py -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
work=$(mktemp -d /tmp/kvstrand-python.XXXXXX)  # the build stays out of $out
site="$work/python"
mkdir -p "$site" "$work/obj"
cp -r "$src/python/kvstrand" "$site/"
pids=() objs=()
for f in "$src"/src/python/*.cpp; do
  o="$work/obj/$(basename "$f" .cpp).o"
  g++ -std=c++20 -O2 -fPIC -fvisibility=hidden -I"$pack/pybind11" -I"$inc" -I"$src/include" -I"$pack/include" \
      -I"$src/src" -c "$f" -o "$o" 2> "$o.log" &
  pids+=($!) objs+=("$o")
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "gpu-python: ${objs[$i]} did not compile:"; cat "${objs[$i]}.log"; exit 1; }
done
lib=$(ls "$pack"/lib/libkvstrand.so.*)  # under its SONAME only
g++ -shared -o "$site/kvstrand/_kvstrand$ext" "${objs[@]}" "$lib" -Wl,-rpath,"$pack/lib" ||
  { echo "gpu-python: the module did not link"; exit 1; }
export PYTHONPATH="$site" KVSTRAND_SERVER="$pack/kvstrand-server" KVSTRAND_SOURCE_DIR="$src" PYTHONDONTWRITEBYTECODE=1
$py -c "import kvstrand, sys; print('kvstrand', kvstrand.__version__, kvstrand.backend(), 'on Python', sys.version.split()[0])"
status=0
if [[ ${3:-} == --tests ]]; then  # --tests "FILE..." [pytest args]: builds the module and runs those alone
  (cd "$src/tests/python" && $py -m pytest -p no:cacheprovider ${4:?--tests needs files} ${5:-}) 2>&1 | tee "$out/pytest.txt"
  exit "${PIPESTATUS[0]}"
fi
if [[ ${3:-} == --bench-only ]]; then
  : >"$out/bench_python.txt"
  for run in 1 2 3; do $py "$src/bench/bench_python.py" | tee -a "$out/bench_python.txt" || status=1; done
  exit $status
fi
(cd "$src/tests/python" && $py -m pytest -q -p no:cacheprovider test_module.py test_stubs.py test_vllm.py test_vllm_serving.py test_vllm_faults.py test_vllm_hybrid.py test_vllm_events.py test_vllm_torch.py test_sglang.py test_sglang_torch.py) \
  2>&1 | tee "$out/pytest.txt" || status=1
# kvstrand.sglang against the oldest SGLang served too (the run above: the newest)
(cd "$src/tests/python" && KVSTRAND_SGLANG_PICTURE=oldest $py -m pytest -q -p no:cacheprovider test_sglang.py) \
  2>&1 | tee -a "$out/pytest.txt" || status=1
# test_vllm*.py against the oldest vLLM verified too (the run above: the newest, conftest's default)
(cd "$src/tests/python" && KVSTRAND_VLLM_PICTURE=oldest $py -m pytest -q -p no:cacheprovider test_vllm.py test_vllm_serving.py test_vllm_faults.py test_vllm_hybrid.py test_vllm_events.py) \
  2>&1 | tee -a "$out/pytest.txt" || status=1
$py "$src/examples/python/engine_loop.py" --requests 200 | tee "$out/engine_loop.txt" || status=1
sock=$(mktemp -u /tmp/kvs-gpu-py.XXXXXX)
"$pack/kvstrand-server" --socket "$sock" --tier-bytes 1G --chunk-tokens 64 --log-level warn &
server=$!
sleep 2
for run in 1 2; do  # the second resumes from what the first stored
  $py "$src/examples/python/engine_loop.py" --requests 200 --server "$sock" | tee -a "$out/engine_loop.txt" || status=1
done
kill "$server"
$py "$src/bench/bench_python.py" | tee "$out/bench_python.txt" || status=1
$py "$src/bench/bench_sglang.py" --server "$pack/kvstrand-server" | tee "$out/bench_sglang.txt" || status=1
echo "gpu-python: $([[ $status == 0 ]] && echo passed || echo FAILED)"
exit $status
