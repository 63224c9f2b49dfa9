#!/usr/bin/env bash
# The whole test suite of a build, PASSES times in a row (fault
# tests must not depend on timing). Within a pass every test binary runs at
# once, as `ctest -j` runs them; a pass fails if any binary does. Stops at
# the first failing pass, or before a pass would start after LIMIT seconds
# (the device tool's per-command limit), and says how many passes ran.
# Writes soak.log (a line per pass) and, for a failing binary, its output.
#
#   ./gpu-soak.sh . PASSES [RESULTS] [LIMIT]     in a pack from scripts/gpu-pack.sh
#   scripts/gpu-soak.sh build 10                 here
set -uo pipefail
build=${1:?usage: gpu-soak.sh BUILD_DIR PASSES [RESULTS] [LIMIT_SECONDS]}
passes=${2:?usage: gpu-soak.sh BUILD_DIR PASSES [RESULTS] [LIMIT_SECONDS]}
results=${3:-${OUT:-soak-results}}
limit=${4:-0}
mkdir -p "$results"
log=$results/soak.log
tests=()
for t in "$build"/tests/test_*; do [[ -x $t && -f $t ]] && tests+=("$t"); done
echo "soak: ${#tests[@]} test binaries per pass, $passes passes, on $(hostname) $(date -u +%FT%TZ)" | tee -a "$log"
start=$SECONDS
ran=0
for ((pass = 1; pass <= passes; ++pass)); do
  if ((limit > 0 && ran > 0)); then
    per=$(((SECONDS - start) / ran))
    if ((SECONDS - start + per + 10 > limit)); then
      echo "soak: stopping before pass $pass: the next would pass the ${limit} s limit" | tee -a "$log"
      break
    fi
  fi
  t0=$SECONDS
  tmp=$(mktemp -d)
  pids=()
  for t in "${tests[@]}"; do
    "$t" --reporter console --durations no >"$tmp/$(basename "$t").log" 2>&1 &
    pids+=($!)
  done
  bad=()
  for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
      name=$(basename "${tests[$i]}")
      bad+=("$name")
      cp "$tmp/$name.log" "$results/soak-fail-pass$pass-$name.log"
    fi
  done
  rm -rf "$tmp"
  ran=$pass
  if ((${#bad[@]} > 0)); then
    echo "pass $pass: FAILED: ${bad[*]} ($((SECONDS - t0)) s)" | tee -a "$log"
    echo "soak: $pass passes, the last failed" | tee -a "$log"
    exit 1
  fi
  echo "pass $pass: all ${#tests[@]} passed ($((SECONDS - t0)) s)" | tee -a "$log"
done
echo "soak: $ran passes in a row, no failure ($((SECONDS - start)) s)" | tee -a "$log"
