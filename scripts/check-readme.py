#!/usr/bin/python3
"""Runs the README's shell blocks as a new user would, so that the README
cannot go stale without `make test` failing. Run by CTest ("readme: ...").

    scripts/check-readme.py [BUILD_DIR [SECTION...]]   (default: every section below)

Sections run: "Quick start", "Embedding", "Python" and "Operating a node" (each section's own
```sh blocks, before its first subsection). Every line runs as written, in
bash with `set -e`, from the source tree (Embedding's from a scratch
directory holding engine.cpp, a copy of examples/consumer/main.cpp, and a
`build` link to the build; "Operating a node" from a fresh copy of the
tree, the files git would commit and nothing it ignores, as a fresh clone
has no build of any kind), except:
- /opt/kvstrand (the install prefix, and the paths that start with it: a
  virtual environment, a config file) and /tmp/kvstrand.sock (the server's
  socket) become paths in a temporary directory, so a user's own install and
  server are never touched;
- `make test` is not run: this check runs inside it;
- the environment shortens `make demo` (DEMO_ARGS: one arm, a few seconds)
  and `make python-demo` (PYTHON_DEMO_ARGS, where the block does not set it),
  and has pip's build compile without optimisation (KVSTRAND_BUILD_TYPE=None,
  setup.py: the same sources in half the time; it was most of `make test`'s
  testing time);
- processes a block starts in the background are stopped after it.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

SECTIONS = ("Quick start", "Embedding", "Python", "Operating a node")


def blocks(readme, section):
    """The ```sh blocks of `## section`, before its first ### heading."""
    out, inside, fence = [], False, None
    for line in readme.splitlines():
        if line.startswith("## ") or line.startswith("### "):
            inside = line == "## " + section
            continue
        if not inside:
            continue
        if fence is None and line.strip() == "```sh":
            fence = []
        elif fence is not None and line.strip() == "```":
            out.append(fence)
            fence = None
        elif fence is not None:
            fence.append(line)
    return out


def fresh_copy(src, to):
    """The tree as a fresh clone of it would be: the files git tracks, and
    those it would add (not ignored), without any build directory."""
    listed = subprocess.run(["git", "-C", src, "ls-files", "-z", "-co", "--exclude-standard"],
                            stdout=subprocess.PIPE, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        here = os.path.join(src, rel)
        if not os.path.lexists(here):
            continue  # deleted in the working tree, not yet in git
        os.makedirs(os.path.dirname(os.path.join(to, rel)), exist_ok=True)
        shutil.copy2(here, os.path.join(to, rel), follow_symlinks=False)
    return to


def main():
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(src, "build"))
    if build != os.path.join(src, "build"):
        print(f"check-readme: the README's commands use {src}/build; this build is {build}: nothing to check")
        return 0
    readme = open(os.path.join(src, "README.md"), encoding="utf-8").read()
    work = tempfile.mkdtemp(prefix="kvstrand-readme.")
    try:
        prefix, sock = os.path.join(work, "prefix"), os.path.join(work, "kvstrand.sock")
        embed = os.path.join(work, "engine")
        os.makedirs(embed)
        shutil.copy(os.path.join(src, "examples/consumer/main.cpp"), os.path.join(embed, "engine.cpp"))
        os.symlink(build, os.path.join(embed, "build"))
        env = dict(os.environ)
        env["DEMO_ARGS"] = "--arms tier --seconds 2 --prompts 64 --time-scale 0 --out " + os.path.join(work, "demo")
        env["PYTHON_DEMO_ARGS"] = "--requests 16"
        env["JOBS"] = env.get("JOBS", "2")
        env["KVSTRAND_BUILD_TYPE"] = env.get("KVSTRAND_BUILD_TYPE", "None")
        ran = 0
        clone = None
        for section in sys.argv[2:] or SECTIONS:
            found = blocks(readme, section)
            if not found:
                print(f"check-readme: no sh block in section '{section}' (renamed? update SECTIONS)")
                return 1
            for n, lines in enumerate(found, 1):
                script = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
                commands = 0
                for line in lines:
                    code = line.split("#", 1)[0].strip()
                    if not code:
                        continue
                    if re.fullmatch(r"make test\b.*", code):
                        print(f"check-readme: [{section} {n}] not run here (this check runs inside it): {code}")
                        continue
                    code = code.replace("/opt/kvstrand", prefix).replace("/tmp/kvstrand.sock", sock)
                    script.append("echo + " + shlex.quote(code))
                    script.append(code)
                    commands += 1
                if section == "Operating a node" and clone is None:
                    clone = fresh_copy(src, os.path.join(work, "clone"))
                cwd = embed if section == "Embedding" else clone if section == "Operating a node" else src
                print(f"check-readme: [{section} {n}] running {commands} command(s) in {cwd}", flush=True)
                t0 = time.monotonic()
                r = subprocess.run(["bash", "-c", "\n".join(script)], cwd=cwd, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                took = time.monotonic() - t0
                if r.returncode != 0:
                    print(r.stdout[-6000:])
                    print(f"check-readme: [{section} {n}] failed (exit {r.returncode}) after {took:.0f} s")
                    return 1
                print(f"check-readme: [{section} {n}] passed in {took:.0f} s", flush=True)
                ran += 1
        print(f"check-readme: {ran} README blocks ran as written")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
