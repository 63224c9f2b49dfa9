#!/usr/bin/python3
"""Every path the docs and the code's comments name exists: a doc that
points at a moved or deleted file fails `make test` (CTest: "docs: ...").

    scripts/check-paths.py            the tree this script is in

And every source folder has a README.md beside its code (each folder of
src/, and include/kvstrand, examples/engine, python/kvstrand): the
module catalogue lives there, not in docs/ARCHITECTURE.md.

Read: README.md, docs/*.md and those READMEs whole; in src/, include/, tests/, examples/,
bench/, python/ and scripts/, the comments (C++ `//` lines, Python and
shell `#` lines and docstrings). A path is a word that starts with one of
the tree's top folders and a slash (`src/server/tier_server.cpp`); it names
a file or folder, or a file without its extension (`src/server/tier_server`
for its .hpp and .cpp). Paths with wildcards or placeholders (`*`, `{`,
`<`, `NAME`) are patterns, not paths, and a path inside another tree
(`.gpu-pack/tests/...`) is not this tree's.
"""
import glob
import os
import re
import sys

TOP = ("src", "tests", "scripts", "docs", "packaging", "examples", "bench", "python", "include", "cmake")
PATH = re.compile(r"(?<![\w/.$-])((?:" + "|".join(TOP) + r")/[\w./+-]*[\w+])")
CODE = ("src", "include", "tests", "examples", "bench", "python", "scripts")
SKIP = ("tests/python/vllm_pictures/", "tests/python/sglang_pictures/")  # others' code, pictured
WITH_README = ("include/kvstrand", "examples/engine", "python/kvstrand")  # and each folder of src/


def exists(root, p):
    p = p.rstrip(".")
    full = os.path.join(root, p)
    return os.path.exists(full) or bool(glob.glob(glob.escape(full) + ".*"))


def comment_lines(path):
    """(line number, text) of the file's comments."""
    py = path.endswith((".py", ".sh", ".txt", ".cmake", ".yml", ".toml", ".in")) or "CMakeLists" in path
    doc = False
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            s = line.strip()
            if py:
                if s.count('"""') == 1:
                    doc = not doc
                    yield n, s
                elif doc or s.startswith("#") or s.count('"""') == 2:
                    yield n, s
                elif "#" in s:
                    yield n, s[s.index("#"):]
            elif "//" in s:
                yield n, s[s.index("//"):]
            elif s.startswith("*") or s.startswith("/*"):
                yield n, s


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    missing = []
    folders = sorted(f for f in glob.glob("src/*", root_dir=root) if os.path.isdir(os.path.join(root, f)))
    folders += WITH_README
    no_readme = [f for f in folders if not os.path.isfile(os.path.join(root, f, "README.md"))]
    docs = ["README.md"] + sorted(glob.glob("docs/*.md", root_dir=root))
    docs += [os.path.join(f, "README.md") for f in folders if f not in no_readme]
    for d in docs:
        with open(os.path.join(root, d), encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                missing += [(d, n, p) for p in paths(line) if not exists(root, p)]
    for top in CODE:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            rel_dir = os.path.relpath(dirpath, root)
            if any((rel_dir + "/").startswith(s) for s in SKIP) or "__pycache__" in rel_dir:
                continue
            for name in files:
                rel = os.path.join(rel_dir, name)
                if not name.endswith((".cpp", ".hpp", ".h", ".cu", ".py", ".sh", ".txt", ".in", ".cmake")):
                    continue
                for n, text in comment_lines(os.path.join(root, rel)):
                    missing += [(rel, n, p) for p in paths(text) if not exists(root, p)]
    for where, n, p in missing:
        print(f"check-paths: {where}:{n} names {p}, which is not in the tree")
    for f in no_readme:
        print(f"check-paths: {f}/ has no README.md: say there what each of its files is")
    print(f"check-paths: {len(missing)} missing path(s) in {len(docs)} docs and the code's comments; "
          f"{len(no_readme)} of {len(folders)} source folders without a README")
    return 1 if missing or no_readme else 0


def paths(text):
    """The paths `text` names: patterns (a wildcard or a placeholder in or
    right after the word) left out."""
    for m in PATH.finditer(text):
        p, after = m.group(1), text[m.end():m.end() + 1]
        if after and after in "*{<" or any(c in p for c in "*{}<>") or re.search(r"[A-Z]{3,}", p):
            continue
        yield p


if __name__ == "__main__":
    sys.exit(main())
