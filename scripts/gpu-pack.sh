#!/usr/bin/env bash
# Makes a cuda build folder self-contained for a GPU machine that has the
# NVIDIA driver but not Debian's spdlog and fmt: copies those shared
# libraries into BUILD/lib, where every binary's RPATH ($ORIGIN/../lib) looks
# first. The CUDA runtime is linked statically. No sources are needed there.
#
#   scripts/gpu-pack.sh build-cuda
set -euo pipefail
build=${1:?usage: gpu-pack.sh BUILD_DIR}
probe=$build/tests/test_device_runtime
[[ -x $probe ]] || { echo "gpu-pack: $probe missing; run make check-backends first" >&2; exit 1; }
mkdir -p "$build/lib"
ldd "$probe" | awk '/libspdlog|libfmt/ {print $3}' | while read -r lib; do
  [[ -e "$build/lib/$(basename "$lib")" ]] || cp -L "$lib" "$build/lib/"  # idempotent
done
ls "$build/lib"
du -sh "$build" | awk '{print "gpu-pack: " $2 " is " $1}'
