#!/usr/bin/python3
"""make mutants-diff BASE=<commit>: mutants made by rule on the lines a change
added or modified since BASE, each run against the tests that build or
import its file; prints every survivor (file, line, what was changed) and
the score.

scripts/mutants.py keeps a table of named, hand-made mutants; this finds
the next untested behaviour of new code before a reviewer does. Rules, on a
changed line of C++ (src/, include/) or Python (python/kvstrand/):

    cmp       a comparison swapped: == and !=, < and >=, > and <=
    bound     an off-by-one: <= for <, >= for >, and the other way
    logic     && and || (and, or) swapped; a ! or not dropped
    bool      true and false (True and False) swapped
    step      a '+ 1' or '- 1' dropped
    stmt      a call statement dropped (';', or pass)
    return    the return (co_return) of an if's one-line branch dropped
    loop      a continue or break dropped

Lines of comments, logging, includes and declarations alone are left out.
A mutant that does not compile is counted apart (not in the score). A test
that hangs past --per-test counts as not catching (a test must end whatever
the code under it does).

Tests chosen per file: for src/DIR/NAME.*, the Catch binaries of
tests/DIR/test_NAME.cpp and of every test file that includes "DIR/NAME.hpp"
(at most --max-tests, the direct one first); a file no test includes (a
part of kvstrand-server's program) gets the Python suite's file named for a
word of NAME, then its folder's tests sharing the most names with the
mutated line; for python/kvstrand/PKG/*.py and src/python/*, the pytest
files that import kvstrand.PKG (or kvstrand).
Each is run whole, under --per-test seconds.

Reproducible: the mutants are sampled with --seed (at most --max of them),
and the run stops starting mutants once --budget seconds have passed.

    scripts/diff_mutants.py --base b4cfd90 [--max 30] [--budget 1800] [--seed 1]
    scripts/diff_mutants.py --base HEAD~3 --list      the mutants, no build
"""
import argparse
import os
import random
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mutants import run  # noqa: E402  (same directory)

SOURCES = ("src/", "include/", "python/kvstrand/")
SKIP_LINE = re.compile(r"^\s*(//|#|\*|/\*|\"\"\"|'''|$)|spdlog::|\blog\.(debug|info|warning|error)\b|"
                       r"^\s*(#include|using |namespace |import |from \S+ import|static_assert)")


def string_rows(text):
    """Rows (1-based) of a Python file inside multi-line strings (docstrings)."""
    import io
    import tokenize
    rows = set()
    try:
        for t in tokenize.generate_tokens(io.StringIO(text).readline):
            if t.type == tokenize.STRING and t.end[0] > t.start[0]:
                rows.update(range(t.start[0], t.end[0] + 1))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return rows


def changed_lines(repo, base):
    """{path: [line numbers in HEAD]} of lines added or modified since base."""
    diff = run(["git", "diff", "-U0", "--diff-filter=AM", base, "HEAD", "--", *SOURCES], repo).stdout
    out, path = {}, None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else None
            if path and not re.search(r"\.(cpp|hpp|py)$", path):
                path = None
        elif line.startswith("@@") and path:
            m = re.match(r"@@ -\S+ \+(\d+)(?:,(\d+))? @@", line)
            start, count = int(m.group(1)), int(m.group(2) or 1)
            out.setdefault(path, []).extend(range(start, start + count))
    return out


STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'')


def mutations(line, python):
    """(rule, mutated line) for one line of code; nothing inside a string
    literal or a comment is changed."""
    out = []
    # The code with its string literals blanked (same length): matches in
    # it are matches in the line outside strings.
    code = STRING.sub(lambda m: '"' + " " * (len(m.group()) - 2) + '"', line)
    cut = code.find("#" if python else "//")
    if cut >= 0:
        code = code[:cut]

    def sub(rule, pattern, repl):
        for m in re.finditer(pattern, code):
            out.append((rule, line[:m.start()] + m.expand(repl) + line[m.end():]))

    sub("cmp", r" == ", " != ")
    sub("cmp", r" != ", " == ")
    sub("cmp", r" < ", " >= ")
    sub("cmp", r" > ", " <= ")
    sub("bound", r" <= ", " < ")
    sub("bound", r" >= ", " > ")
    sub("bound", r" < ", " <= ")
    sub("bound", r" > ", " >= ")
    sub("step", r" [+-] 1\b", "")
    # The language's own spellings of the same rules.
    if python:
        logic = [(r" and ", " or "), (r" or ", " and "), (r"\bnot ", "")]
        bools = [(r"\bTrue\b", "False"), (r"\bFalse\b", "True")]
        call, keep, dropped, exits = r"^[\w.\[\]]+\(.*\)$", r"^(return|yield|raise)\b", "pass", ("continue", "break")
    else:
        logic = [(r" && ", " || "), (r" \|\| ", " && "), (r"(?<![!=])!(?=[\w(])", "")]
        bools = [(r"\btrue\b", "false"), (r"\bfalse\b", "true")]
        call, keep = r"^[\w:.>\-\[\]()]+\(.*\);$", r"^(return|co_return|co_await|throw|delete|case|if|for|while)\b"
        dropped, exits = ";", ("continue;", "break;")
    for pattern, repl in logic:
        sub("logic", pattern, repl)
    for pattern, repl in bools:
        sub("bool", pattern, repl)
    stripped = line.strip()
    if re.match(call, stripped) and not re.match(keep, stripped):
        out.append(("stmt", line[:len(line) - len(line.lstrip())] + dropped))
    if stripped in exits:
        out.append(("loop", line.replace(stripped, dropped)))
    if not python:
        m = re.match(r"^(\s*if \(.*\)) (co_)?return\b.*;$", line)
        if m:
            out.append(("return", m.group(1) + " {}"))
    return out


def tests_for(repo, path, max_tests, line=""):
    """What to run for a mutant of `path`: ("catch", binary) or ("pytest", file).
    A file no test builds directly (a server's part, linked into the
    program the tests start) gets its folder's tests that share the most
    names with the mutated line."""
    if path.startswith("python/kvstrand/") or path.startswith("src/python/"):
        parts = path.split("/")
        module = "kvstrand." + parts[2] if path.startswith("python/kvstrand/") and len(parts) > 3 else "kvstrand"
        files = sorted(f for f in os.listdir(os.path.join(repo, "tests", "python")) if f.startswith("test_"))
        chosen = [f for f in files if module != "kvstrand" and module in open(os.path.join(repo, "tests", "python", f)).read()]
        if not chosen:
            chosen = [f for f in files if "import kvstrand" in open(os.path.join(repo, "tests", "python", f)).read()]
        # The package's own test files first (test_vllm*.py for kvstrand.vllm).
        chosen.sort(key=lambda f: (module.split(".")[-1] not in f, f))
        return [("pytest", f) for f in chosen[:max_tests]]
    rel = path.split("/", 1)[1] if path.startswith("src/") else path.split("/", 2)[-1]
    folder, name = os.path.split(rel)
    stem = os.path.splitext(name)[0]
    direct = os.path.join("tests", folder, f"test_{stem}.cpp")
    found = [direct] if os.path.exists(os.path.join(repo, direct)) else []
    header = f'"{folder}/{stem}.hpp"' if folder else f"{stem}.hpp"
    for root, _, files in os.walk(os.path.join(repo, "tests")):
        for f in sorted(files):
            p = os.path.relpath(os.path.join(root, f), repo)
            if f.startswith("test_") and f.endswith(".cpp") and p not in found and header in open(os.path.join(repo, p)).read():
                found.append(p)
    if not found:
        names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]{4,}", STRING.sub("", line))) - {"const", "return", "static"}
        ranked = []
        folder_dir = os.path.join(repo, "tests", folder)
        for f in sorted(os.listdir(folder_dir)) if os.path.isdir(folder_dir) else []:
            if f.startswith("test_") and f.endswith(".cpp"):
                body = open(os.path.join(folder_dir, f)).read()
                score = sum(1 for n in names if n in body) + (2 if stem.replace("_", " ") in body else 0)
                if score:
                    ranked.append((-score, os.path.join("tests", folder, f)))
        found = [p for _, p in sorted(ranked)]
        # And the Python suite's files named for a word of it (event_publisher:
        # test_server_events.py), which drive the server as engines do.
        words = {w.rstrip("s") for w in stem.split("_") if len(w) >= 4}
        py = sorted(f for f in os.listdir(os.path.join(repo, "tests", "python"))
                    if f.startswith("test_") and f.endswith(".py") and any(w in f for w in words))
        return ([("pytest", f) for f in py[:1]] + [("catch", os.path.splitext(os.path.basename(p))[0])
                                                   for p in found])[:max_tests]
    return [("catch", os.path.splitext(os.path.basename(p))[0]) for p in found[:max_tests]]


def command(build, scratch, kind, name):
    if kind == "catch":
        return [os.path.join(build, "tests", name)]
    return ["env", f"PYTHONPATH={build}/python", f"KVSTRAND_SERVER={build}/kvstrand-server",
            "PYTHONDONTWRITEBYTECODE=1", "/usr/bin/python3", "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
            os.path.join(scratch, "tests", "python", name)]


def targets(kind, name):
    return ["kvstrand_python", "kvstrand-server"] if kind == "pytest" else [name, "kvstrand-server"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max", type=int, default=30, help="mutants at most (a sample of them all)")
    ap.add_argument("--budget", type=int, default=1800, help="seconds after which no mutant is started")
    ap.add_argument("--per-test", type=int, default=120, help="seconds one test run may take")
    ap.add_argument("--max-tests", type=int, default=3, help="test binaries or files run per mutant")
    ap.add_argument("--list", action="store_true", help="print the sampled mutants and their tests; build nothing")
    a = ap.parse_args()
    repo = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip()
    head = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=repo, text=True).strip()
    every = []
    for path, lines in sorted(changed_lines(repo, a.base).items()):
        whole = open(os.path.join(repo, path)).read()
        text = whole.split("\n")
        docs = string_rows(whole) if path.endswith(".py") else set()
        for n in lines:
            if n - 1 < len(text) and n not in docs and not SKIP_LINE.search(text[n - 1]):
                every += [(path, n, text[n - 1], rule, new) for rule, new in mutations(text[n - 1], path.endswith(".py"))]
    sample = sorted(random.Random(a.seed).sample(every, min(a.max, len(every))))
    print(f"mutants-diff: {len(every)} mutants on the lines changed since {a.base}; {len(sample)} sampled "
          f"(seed {a.seed})", flush=True)
    plans = [(m, tests_for(repo, m[0], a.max_tests, m[2])) for m in sample]
    if a.list:
        for (path, n, old, rule, new), tests in plans:
            print(f"  {path}:{n} {rule}: {old.strip()}  ->  {new.strip()}   [{', '.join(t for _, t in tests) or 'no test'}]")
        return 0
    scratch = os.environ.get("MUTANTS_DIFF_DIR", "/tmp/kvstrand-mutants-diff")
    if not os.path.isdir(scratch):
        run(["git", "worktree", "add", "--detach", scratch, head], repo).check_returncode()
    run(["git", "checkout", "--detach", "--force", head], scratch).check_returncode()
    build = os.path.join(scratch, "build")
    cfg = run(["cmake", "-S", ".", "-B", "build", "-G", "Ninja", "-Wno-dev", "-DKVSTRAND_GPU=sim",
               "-DKVSTRAND_BENCH=OFF"], scratch)
    if cfg.returncode != 0:
        print(cfg.stdout)
        return 2
    started = time.time()
    results = []
    for (path, n, old, rule, new), tests in plans:
        if time.time() - started > a.budget:
            print(f"mutants-diff: the {a.budget} s budget is spent; {len(plans) - len(results)} mutants not run")
            break
        where = f"{path}:{n} {rule}: {old.strip()}  ->  {new.strip()}"
        if not tests:
            results.append(("no test", where, "no test builds or imports this file"))
            print(f"  no test    {where}", flush=True)
            continue
        file = os.path.join(scratch, path)
        lines = open(file).read().split("\n")
        original = lines[n - 1]
        lines[n - 1] = new
        open(file, "w").write("\n".join(lines))
        t0 = time.time()
        try:
            b = run(["cmake", "--build", "build", "--target", *sorted({t for k, nm in tests for t in targets(k, nm)})],
                    scratch)
            if b.returncode != 0:
                verdict, why = "not built", "it does not compile"
            else:
                verdict, why = "SURVIVED", "every test passed"
                for kind, name in tests:
                    try:
                        r = run(command(build, scratch, kind, name), scratch, timeout=a.per_test)
                    except subprocess.TimeoutExpired:
                        verdict, why = "SURVIVED", f"{name} hung past {a.per_test} s"
                        break
                    if r.returncode != 0 and not (kind == "pytest" and r.returncode == 5):
                        verdict, why = "caught", f"{name} failed"
                        break
        finally:
            lines[n - 1] = original
            open(file, "w").write("\n".join(lines))
        results.append((verdict, where, why))
        print(f"  {verdict:10} ({time.time() - t0:.0f} s) {where}   [{why}]", flush=True)
    caught = sum(1 for r in results if r[0] == "caught")
    scored = sum(1 for r in results if r[0] in ("caught", "SURVIVED", "no test"))
    print(f"mutants-diff: {caught} of {scored} caught ({100 * caught / max(1, scored):.0f} %); "
          f"{sum(1 for r in results if r[0] == 'not built')} did not compile; base {a.base}, seed {a.seed}")
    for verdict, where, why in results:
        if verdict in ("SURVIVED", "no test"):
            print(f"  survivor: {where}   [{why}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
