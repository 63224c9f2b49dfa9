#!/usr/bin/python3
"""No source file over 600 lines (CTest: "sources: ..."), in src/,
include/, tests/, examples/, scripts/, bench/ and python/: a file that long
holds more than one concept. The files already over it when the check came
are listed with the length they had: each may shrink, never grow, and
comes off the list once split (issue 65's redesign).

    scripts/check-lines.py

And docs/ARCHITECTURE.md at most 300 lines: the rule, the picture, a save
and a load end to end, the threads, the failures; what each file is lives
in the README beside it.
"""
import os
import sys

LIMIT = 600
FOLDERS = ("src", "include", "tests", "examples", "scripts", "bench", "python")
EXTENSIONS = (".cpp", ".hpp", ".h", ".cu", ".py", ".sh")
SKIP = ("tests/python/vllm_pictures/", "tests/python/sglang_pictures/")  # others' code, pictured
# Over the limit before the check: at most this long until split.
ALREADY_OVER: dict[str, int] = {}  # empty since examples/engine/engine.cpp and bench_transfer.cpp were split
DOCS = {"docs/ARCHITECTURE.md": 300}


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bad = []
    for top in FOLDERS:
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            rel_dir = os.path.relpath(dirpath, root)
            if any((rel_dir + "/").startswith(s) for s in SKIP):
                continue
            for name in files:
                if not name.endswith(EXTENSIONS):
                    continue
                rel = os.path.join(rel_dir, name)
                with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                    n = sum(1 for _ in f)
                bound = ALREADY_OVER.get(rel, LIMIT)
                if n > bound:
                    bad.append(f"check-lines: {rel} has {n} lines, more than {bound}" +
                               ("" if rel not in ALREADY_OVER else " (it may shrink, never grow)") +
                               ": split it, one concept a file")
    for rel, bound in DOCS.items():
        with open(os.path.join(root, rel), encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > bound:
            bad.append(f"check-lines: {rel} has {n} lines, more than {bound}: move the detail to the README "
                       "of the folder it describes")
    for line in bad:
        print(line)
    print(f"check-lines: {len(bad)} file(s) over their bound")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
