#!/usr/bin/python3
"""make mutants: break the code on purpose, one named mutant at a time, and
check that the tests which claim to guard each one fail.

For every mutant: a scratch copy of the committed tree (git worktree, with
its own sim build) gets that one edit, only the test binaries concerned are
built, their named cases run (each under a time limit), and the edit is
reverted. A mutant is caught when a case fails by an assertion (or a crash);
a case that hangs past its limit counts as NOT caught, because a test must
end whatever the code under it does wrong. Exits 1 if any mutant was not
caught, or could not be applied (the code it names moved: update the table).

    make mutants                       all of them
    scripts/mutants.py F14-timer F4    the named ones
    scripts/mutants.py --list
    scripts/mutants.py --check         every mutant's code is found once (no build; a CTest entry)

Not in CI: each mutant rebuilds part of the tree (about a minute here).
"""
import os
import subprocess
import sys
import time

# The table, in three parts (scripts/mutants_*.py): each entry is name, file,
# code as it is, code as the mutant has it, the tests that claim to catch it,
# what it breaks. A new mutant goes in the part its code belongs to.
from mutants_engine import MUTANTS as ENGINE  # noqa: E402  (same directory)
from mutants_rounds import MUTANTS as ROUNDS  # noqa: E402
from mutants_server import MUTANTS as SERVER  # noqa: E402

MUTANTS = ENGINE + SERVER + ROUNDS

TIMEOUT_S = 120


def run(cmd, cwd, timeout=None):
    # errors="replace": a test may print a peer's raw bytes (a failing
    # assertion on a msgpack frame), which are no UTF-8.
    return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          errors="replace", timeout=timeout)


def test_command(build, scratch, binary, filt):
    """A Catch binary with a filter, or "pytest:FILE" with a -k expression
    (Debian's interpreter, the scratch build's module and server)."""
    if not binary.startswith("pytest:"):
        return [os.path.join(build, "tests", binary), filt]
    path, _, picture = binary[len("pytest:"):].partition("@")
    return ["env", f"PYTHONPATH={build}/python", f"KVSTRAND_SERVER={build}/kvstrand-server",
            "PYTHONDONTWRITEBYTECODE=1", f"KVSTRAND_VLLM_PICTURE={picture or 'newest'}", "/usr/bin/python3", "-m",
            "pytest", "-q", "-p", "no:cacheprovider", os.path.join(scratch, "tests", "python", path), "-k", filt]


def build_targets(test):
    """What a test needs built: its binary, or the Python module (which copies
    the package) and the server the Python suite starts (a mutant of the
    server checked by a Python test is rebuilt into it)."""
    return ["kvstrand_python", "kvstrand-server"] if test.startswith("pytest:") else [test]


def main(argv):
    if "--list" in argv:
        for name, path, _, _, tests, what in MUTANTS:
            print(f"{name:20} {path:34} {what}")
        return 0
    if "--check" in argv:
        # Cheap, no build: every mutant still names code found exactly once
        # (a refactor that moves the code leaves the mutant unapplied).
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        stale = [(name, path, open(os.path.join(repo, path)).read().count(old))
                 for name, path, old, _, _, _ in MUTANTS]
        stale = [s for s in stale if s[2] != 1]
        for name, path, n in stale:
            print(f"mutants: {name}: its code is found {n} times in {path}")
        print(f"mutants: {len(MUTANTS) - len(stale)} of {len(MUTANTS)} apply")
        return 1 if stale else 0
    chosen = [m for m in MUTANTS if not argv or m[0] in argv]
    unknown = set(argv) - {m[0] for m in MUTANTS}
    if unknown:
        print("mutants: unknown mutant(s): " + ", ".join(sorted(unknown)) + " (see --list)")
        return 2
    repo = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip()
    scratch = os.environ.get("MUTANTS_DIR", "/tmp/kvstrand-mutants")
    head = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=repo, text=True).strip()
    if not os.path.isdir(scratch):
        run(["git", "worktree", "add", "--detach", scratch, head], repo).check_returncode()
    run(["git", "checkout", "--detach", "--force", head], scratch).check_returncode()
    build = os.path.join(scratch, "build")
    print(f"mutants: {len(chosen)} mutant(s) of {head[:10]} in {scratch}", flush=True)
    cfg = run(["cmake", "-S", ".", "-B", "build", "-G", "Ninja", "-Wno-dev", "-DKVSTRAND_GPU=sim",
               "-DKVSTRAND_BENCH=OFF"], scratch)
    if cfg.returncode != 0:
        print(cfg.stdout)
        return 2
    targets = sorted({b for m in chosen for t, _ in m[4] for b in build_targets(t)} |
                     {"kvstrand-server", "kvstrand-tier-client"})
    t0 = time.time()
    base = run(["cmake", "--build", "build", "--target", *targets], scratch)
    if base.returncode != 0:
        print(base.stdout[-4000:])
        return 2
    print(f"mutants: unmutated build of {len(targets)} targets in {time.time() - t0:.0f} s", flush=True)
    results = []
    for name, path, old, new, tests, what in chosen:
        file = os.path.join(scratch, path)
        text = open(file).read()
        if text.count(old) != 1:
            results.append((name, "NOT APPLIED", f"the code it names is found {text.count(old)} times in {path}"))
            print(f"  {name:20} NOT APPLIED", flush=True)
            continue
        open(file, "w").write(text.replace(old, new))
        try:
            t0 = time.time()
            b = run(["cmake", "--build", "build", "--target", *sorted({b for t, _ in tests for b in build_targets(t)})],
                    scratch)
            if b.returncode != 0:
                verdict, why = "NOT BUILT", b.stdout[-600:]
            else:
                verdict, why = "NOT caught", "every named case passed"
                for binary, filt in tests:
                    try:
                        r = run(test_command(build, scratch, binary, filt), scratch, timeout=TIMEOUT_S)
                    except subprocess.TimeoutExpired:
                        verdict, why = "NOT caught", f"{binary} '{filt}' hung past {TIMEOUT_S} s"
                        break
                    # A filter that names no case proves nothing (a Catch spec
                    # splits at commas): the table needs fixing, not a verdict.
                    if "No tests ran" in r.stdout or (binary.startswith("pytest:") and r.returncode == 5):
                        verdict, why = "NO CASE", f"{binary} '{filt}' matches no test case"
                        break
                    if r.returncode != 0:
                        verdict, why = "caught", f"{binary} '{filt}' failed"
                        break
        finally:
            open(file, "w").write(text)
        results.append((name, verdict, why))
        print(f"  {name:20} {verdict:11} ({time.time() - t0:.0f} s) {why.splitlines()[0] if why else ''}", flush=True)
    bad = [r for r in results if r[1] != "caught"]
    print(f"mutants: {len(results) - len(bad)} of {len(results)} caught")
    for name, verdict, why in bad:
        print(f"  {name}: {verdict}: {why}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
