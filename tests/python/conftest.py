"""Shared fixtures of the Python suite: a small engine over sim device memory,
and a real kvstrand-server process (KVSTRAND_SERVER names the binary; CTest
sets it)."""

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np
import pytest

# The picture of vLLM kvstrand.vllm imports (vllm_pictures/README.md):
# placed before anything imports kvstrand.vllm. "none": no vLLM at all.
VLLM_PICTURE = os.environ.setdefault("KVSTRAND_VLLM_PICTURE", "newest")
if VLLM_PICTURE != "none":
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_pictures", VLLM_PICTURE))

import kvstrand  # noqa: E402

BLOCKS = 32
BLOCK_BYTES = 4096


def pytest_sessionstart(session):
    """The tests import kvstrand from a build (PYTHONPATH), which holds a copy
    of python/kvstrand: a copy older than the source would test code that is
    no longer there. With KVSTRAND_SOURCE_DIR (CTest sets it), every
    pure-Python file must be the source's own."""
    src = os.environ.get("KVSTRAND_SOURCE_DIR")
    if not src:
        return
    tree = os.path.join(src, "python", "kvstrand")
    used = os.path.dirname(os.path.abspath(kvstrand.__file__))
    stale = []
    for root, _, files in os.walk(tree):
        for f in files:
            if not f.endswith((".py", ".pyi")):
                continue
            mine = os.path.join(root, f)
            theirs = os.path.join(used, os.path.relpath(mine, tree))
            with open(mine, "rb") as a:
                want = a.read()
            try:
                with open(theirs, "rb") as b:
                    same = b.read() == want
            except FileNotFoundError:
                same = False
            if not same:
                stale.append(os.path.relpath(mine, src))
    if stale:
        pytest.exit(f"kvstrand imported from {used} is not the source tree's: {', '.join(sorted(stale))} differ "
                    "(rebuild: cmake --build build --target kvstrand_python)", returncode=3)


def make_layout(**overrides):
    """One stateless group: 16-token blocks, 64-token chunks, one 4 KiB plane."""
    fields = dict(model_id="pytest", layout_name="pytest", planes=[kvstrand.Plane("kv", BLOCK_BYTES)],
                  block_tokens=16, chunk_tokens=64, dtype="bf16")
    fields.update(overrides)
    return kvstrand.Layout(**fields)


def pattern(nbytes, seed):
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


class Engine:
    """A Connector over one registration in sim device memory the test can see."""

    def __init__(self, layout=None, **options):
        options.setdefault("tier_bytes", 8 << 20)
        options.setdefault("transfer_deadline", 20.0)
        self.layout = layout or make_layout()
        self.memory = kvstrand.sim.allocate(BLOCKS * BLOCK_BYTES)
        self.blocks = np.frombuffer(self.memory, dtype=np.uint8).reshape(BLOCKS, BLOCK_BYTES)
        self.conn = kvstrand.Connector(**options)
        self.group = self.conn.register_layout(
            kvstrand.Registration(self.layout, [kvstrand.PlaneMemory(self.memory.address, BLOCKS)]))
        self.seen = []  # every Finished drained, for tests that look back

    def keys(self, tokens):
        return kvstrand.chunk_keys(self.layout, tokens)

    def spec(self, request, tokens, first_block, end, begin=0, tier_lease=0):
        bt, ct = self.layout.block_tokens, self.layout.chunk_tokens
        keys = self.keys(tokens)[begin // ct:(end + ct - 1) // ct]
        return kvstrand.TransferSpec(request=request, registration=self.group,
                                     tokens=kvstrand.TokenRange(begin, end), keys=keys,
                                     blocks=list(range(first_block, first_block + (end - begin) // bt)),
                                     tier_lease=tier_lease)

    def wait(self, saves=0, loads=0, lookups=0, timeout=10.0):
        """Drains finished() until that many outcomes arrived; returns them."""
        acc = {"saves": [], "loads": [], "lookups": [], "source_safe": []}
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            f = self.conn.finished()
            self.seen.append(f)
            for k in acc:
                acc[k].extend(getattr(f, k))
            if len(acc["saves"]) >= saves and len(acc["loads"]) >= loads and len(acc["lookups"]) >= lookups:
                return acc
            time.sleep(0.002)
        raise AssertionError(f"waited {timeout} s for {saves} saves, {loads} loads, {lookups} lookups; got "
                             f"{len(acc['saves'])}, {len(acc['loads'])}, {len(acc['lookups'])}")

    def close(self):
        self.conn.close()


@pytest.fixture
def engine():
    e = Engine()
    yield e
    e.close()


def server_binary():
    path = os.environ.get("KVSTRAND_SERVER") or shutil.which("kvstrand-server")
    if not path:
        pytest.fail("KVSTRAND_SERVER is not set and kvstrand-server is not on PATH")
    return path


class Server:
    """kvstrand-server on a socket of its own, ready once its arena is."""

    def __init__(self, tier="32M", slab="8M", chunk_tokens=64, socket=None, extra=()):
        """`socket`: a path a killed server left (a restart on it); a fresh one otherwise.
        Its debug endpoint listens on a loopback port of its own (tier()). `extra`: more flags."""
        self.dir = tempfile.mkdtemp(prefix="kvs-py-", dir="/tmp")  # socket paths are short
        self.socket = socket or os.path.join(self.dir, "tier.sock")
        if socket and os.path.exists(socket):
            os.unlink(socket)
        self.proc = subprocess.Popen(
            [server_binary(), "--socket", self.socket, "--tier-bytes", tier, "--slab-bytes", slab,
             "--chunk-tokens", str(chunk_tokens), "--log-level", "info", "--http", "127.0.0.1:0", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = queue.Queue()
        self.log = []

        def drain():  # keeps the pipe from filling for the server's whole life
            for line in self.proc.stdout:
                self.log.append(line)
                lines.put(line)

        threading.Thread(target=drain, daemon=True).start()
        end = time.monotonic() + 30
        ready, self.http = False, None
        while True:
            try:
                line = lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise AssertionError("kvstrand-server not ready after 30 s:\n" + "".join(self.log))
            if "debug endpoint on http://" in line:
                self.http = line.split("http://", 1)[1].split("/", 1)[0]
            ready = ready or "slabs are ready" in line
            if ready and self.http:  # either line may come first
                return

    def metric(self, name):
        """kvstrand_server_NAME (a sample line's name with its labels) from /metrics; None when absent."""
        with urllib.request.urlopen(f"http://{self.http}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("kvstrand_server_" + name + " "):
                    return float(line.rsplit(" ", 1)[1])
        return None

    def tier(self):
        """The server's /debug/tier: objects, leases, reservations, ..."""
        with urllib.request.urlopen(f"http://{self.http}/debug/tier", timeout=5) as r:
            return json.loads(r.read())

    def kill(self):
        """SIGKILL, reaped; the socket file stays, as a crash leaves it."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture
def block_server():
    """A server whose chunks are one 16-token block: every step end of a
    Mamba model's block-aligned prefill is a chunk end (test_vllm*.py)."""
    s = Server(chunk_tokens=16)
    yield s
    s.stop()
