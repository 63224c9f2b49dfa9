#!/usr/bin/env bash
# Installs a build into a temporary prefix and builds and runs an engine
# outside kvstrand's tree against it, twice: with find_package(kvstrand) and
# with pkg-config. Also checks that the installed headers name no Boost and
# no vendor runtime. Run by CTest ("install: ...").
#
#   scripts/check-install.sh BUILD_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/kvstrand-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix="$work/prefix"

cmake --install "$build" --prefix "$prefix" > "$work/install.log"
for f in lib/libkvstrand.so include/kvstrand/connector.hpp include/kvstrand/version.hpp \
         lib/cmake/kvstrand/kvstrandConfig.cmake lib/cmake/kvstrand/kvstrandConfigVersion.cmake \
         lib/pkgconfig/kvstrand.pc bin/kvstrand-server; do
  [[ -e "$prefix/$f" ]] || { echo "check-install: $f was not installed"; exit 1; }
done
if grep -rlE '#include *[<"](boost|hip/hip_runtime|cuda_runtime|cuda\.h|spdlog)' "$prefix/include/kvstrand"; then
  echo "check-install: an installed header includes Boost, spdlog or a vendor runtime (listed above)"
  exit 1
fi
if grep -q INTERFACE_COMPILE_DEFINITIONS "$prefix"/lib/cmake/kvstrand/kvstrandTargets*.cmake; then
  echo "check-install: kvstrand::kvstrand passes compile definitions to its users"
  exit 1
fi
"$prefix/bin/kvstrand-server" --version
# The node service: the unit names the installed server and passes systemd's
# check; the example config is one the installed server takes.
for f in lib/systemd/system/kvstrand-server.service lib/sysusers.d/kvstrand.conf share/kvstrand/kvstrand-server.toml \
         share/doc/kvstrand/operations.md; do
  [[ -e "$prefix/$f" ]] || { echo "check-install: $f was not installed"; exit 1; }
done
grep -q "^ExecStart=$prefix/bin/kvstrand-server --config " "$prefix/lib/systemd/system/kvstrand-server.service" ||
  { echo "check-install: the unit does not run the installed server"; exit 1; }
systemd-analyze verify "$prefix/lib/systemd/system/kvstrand-server.service"
# Hardened: systemd's exposure score at most 3.0 (its --threshold is in tenths).
systemd-analyze security --offline=true --threshold=30 "$prefix/lib/systemd/system/kvstrand-server.service" \
  > "$work/security.log" || { cat "$work/security.log"; echo "check-install: the unit's exposure is over 3.0"; exit 1; }
# (its tier-bytes is a host's; this machine's is smaller: the command line wins)
"$prefix/bin/kvstrand-server" --config "$prefix/share/kvstrand/kvstrand-server.toml" --tier-bytes 64M --print-config > /dev/null

cmake -S "$src/examples/consumer" -B "$work/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" > "$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/consumer" > "$work/build.log" || { cat "$work/build.log"; exit 1; }
"$work/consumer/kvstrand-consumer"

# pkg-config, as a Makefile-built engine would use it.
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
[[ "$(pkg-config --modversion kvstrand)" == "$(sed -n 's/#define KVSTRAND_VERSION_STRING "\(.*\)"/\1/p' "$prefix/include/kvstrand/version.hpp")" ]] ||
  { echo "check-install: pkg-config's version differs from the headers'"; exit 1; }
# shellcheck disable=SC2046
c++ -O1 "$src/examples/consumer/main.cpp" -o "$work/consumer-pc" $(pkg-config --cflags --libs kvstrand) -pthread
# The .pc's libs carry the run-time path: the binary starts as built, with
# no LD_LIBRARY_PATH and no ldconfig.
env -u LD_LIBRARY_PATH "$work/consumer-pc"

# The Python package, where a build has it: importable from the prefix's
# dist-packages, finding the installed libkvstrand.so by itself.
if [[ -d "$build/python/kvstrand" ]]; then
  site="$prefix/lib/python3/dist-packages"
  for f in kvstrand/__init__.py kvstrand/_kvstrand.pyi kvstrand/py.typed kvstrand/vllm/connector.py \
           kvstrand/sglang/storage.py; do
    [[ -e "$site/$f" ]] || { echo "check-install: python/$f was not installed"; exit 1; }
  done
  (cd "$work" && env -u LD_LIBRARY_PATH PYTHONPATH="$site" /usr/bin/python3 - "$prefix" <<'PY'
import sys
import kvstrand, kvstrand.vllm, kvstrand.sglang
assert kvstrand.__file__.startswith(sys.argv[1]), kvstrand.__file__
with kvstrand.Connector(tier_bytes=4 << 20) as c:
    layout = kvstrand.Layout(model_id="m", layout_name="l", planes=[kvstrand.Plane("kv", 4096)], dtype="bf16")
    c.register_layout(kvstrand.Registration(layout))
print("check-install: python module", kvstrand.__version__, "imported from the prefix")
PY
  ) || { echo "check-install: the installed Python module does not import or run"; exit 1; }
fi
echo "check-install: installed, found by find_package and pkg-config, consumers ran"
