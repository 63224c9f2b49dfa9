#!/usr/bin/env bash
# Packs a cuda build for a GPU machine that has the NVIDIA driver but not
# Debian's spdlog and fmt: the binaries only (and libkvstrand.so) (no sources, no object files;
# pybind11's headers for gpu-python.sh, which builds the Python module there),
# in the build's own layout (tests/, bench/, examples/, kvstrand-server), and
# those two shared libraries in lib/, where every binary's RPATH looks first.
# The CUDA runtime is linked statically.
#
#   scripts/gpu-pack.sh build-cuda [PACK]    (PACK defaults to .gpu-pack)
set -euo pipefail
build=${1:?usage: gpu-pack.sh BUILD_DIR [PACK]}
pack=${2:-.gpu-pack}
probe=$build/tests/test_device_runtime
[[ -x $probe ]] || { echo "gpu-pack: $probe missing; run make check-backends first" >&2; exit 1; }
rm -rf "$pack"
mkdir -p "$pack/lib"
(cd "$build" && find . -path ./CMakeFiles -prune -o -type f -perm -u+x ! -name '*.so*' ! -name '*.sh' -print) |
  while read -r bin; do
    [[ $(head -c 4 "$build/$bin") == $'\x7fELF' ]] || continue
    mkdir -p "$pack/$(dirname "$bin")"
    cp "$build/$bin" "$pack/$bin"
    strip --strip-unneeded "$pack/$bin"  # symbols are most of a static binary: the carry limit is 64 MiB
  done
ldd "$probe" | awk '/libspdlog|libfmt/ {print $3}' | while read -r lib; do cp -L "$lib" "$pack/lib/"; done
# libkvstrand.so (what test_public_api links), under its SONAME.
for lib in "$build"/libkvstrand.so.*.*.*; do
  [[ -e $lib ]] || continue
  soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
  cp -L "$lib" "$pack/lib/$soname"
  strip --strip-unneeded "$pack/lib/$soname"
done
cp scripts/gpu-run.sh scripts/gpu-soak.sh scripts/gpu-python.sh scripts/gpu-goal.sh "$pack/"
# What gpu-python.sh builds the Python module with there (its sources come
# from the carried tree): pybind11's headers and the generated version.hpp.
mkdir -p "$pack/pybind11" "$pack/include/kvstrand"
cp -r /usr/include/pybind11 "$pack/pybind11/"
cp "$build/include/kvstrand/version.hpp" "$pack/include/kvstrand/"
du -sh "$pack" | awk '{print "gpu-pack: " $2 " is " $1 " (carry it; run ./gpu-run.sh . $OUT there)"}'
