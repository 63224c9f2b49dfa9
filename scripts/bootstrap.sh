#!/usr/bin/env bash
# Installs, from Debian's packages, whatever the build needs and is missing.
# Does nothing (and asks no registry) when everything is present.
#
#   scripts/bootstrap.sh          what `make demo` and `make test` need
#   scripts/bootstrap.sh --hip    also the HIP headers and runtime, for the
#                                 hip backend's compile-and-link check
#   scripts/bootstrap.sh --fuzz   also clang-14 and its libFuzzer runtime
#   scripts/bootstrap.sh --operator  also what README's "Operating a node"
#                                 needs: venv, setuptools and wheel (pip
#                                 install .), systemd (systemd-analyze)
#   scripts/bootstrap.sh --test   also what the tests drive: curl, promtool
#                                 (prometheus), headless chromium, pytest,
#                                 prometheus_client (the pictures of vLLM),
#                                 venv, setuptools and wheel (pip install .),
#                                 systemd-analyze (the unit), PyYAML (the
#                                 Prometheus test), pyzmq and
#                                 msgpack (a KV event subscriber)
set -euo pipefail

pkgs=(make cmake ninja-build g++ mold libboost1.81-dev libspdlog-dev catch2 libssl-dev libcli11-dev gnuplot-nox
      libhiredis-dev redis-server redis-tools libxxhash-dev liburing-dev libzmq3-dev libtomlplusplus-dev
      python3 python3-dev pybind11-dev python3-numpy)
case "${1:-}" in
  --hip) pkgs+=(libamdhip64-dev) ;;
  --fuzz) pkgs+=(clang-14 libclang-rt-14-dev) ;;
  --operator) pkgs+=(python3-venv python3-setuptools python3-wheel systemd) ;;
  --test) pkgs+=(curl prometheus chromium pkg-config python3-pytest python3-prometheus-client
                python3-venv python3-setuptools python3-wheel systemd python3-zmq python3-msgpack python3-yaml) ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

echo "bootstrap: installing from Debian: ${missing[*]}"
sudo=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "bootstrap: need root or sudo to install ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
