"""examples/python/engine_loop.py, as the README runs it: every resumed
request is checked against its recompute, and the check itself catches a
wrong byte."""

import importlib.util
import os
import subprocess
import sys
import time

from conftest import Server

EXAMPLE = os.path.join(os.environ.get("KVSTRAND_SOURCE_DIR", os.path.join(os.path.dirname(__file__), "..", "..")),
                       "examples", "python", "engine_loop.py")


def run(*args):
    r = subprocess.run([sys.executable, EXAMPLE, *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip().splitlines()[-1]


def resumed(line):
    return int(line.split(" resumed")[0].rsplit(" ", 1)[1])


def test_the_example_resumes_requests_exactly_on_the_embedded_tier():
    line = run("--requests", "48")
    assert "48 requests" in line and " 0 mismatches" in line and resumed(line) > 0


def test_the_example_resumes_from_a_server_another_run_filled():
    s = Server(tier="64M", slab="8M")
    try:
        first = run("--requests", "24", "--server", s.socket)
        again = run("--requests", "24", "--server", s.socket)  # the same prompts, a new process
        assert " 0 mismatches" in first and " 0 mismatches" in again
        assert resumed(again) == 24
    finally:
        s.stop()


def test_the_example_completes_every_request_with_no_server_at_all(tmp_path):
    # Before: each request re-posted its failing save every step and never
    # freed its blocks; with no server the run never ended.
    line = run("--requests", "24", "--server", str(tmp_path / "nobody.sock"))
    assert "24 requests" in line and " 0 mismatches" in line and resumed(line) == 0
    assert " 0 failed saves" not in line


def test_the_example_keeps_admitting_while_its_server_is_killed_and_restarted():
    s = Server(tier="64M", slab="8M")
    proc = subprocess.Popen([sys.executable, EXAMPLE, "--requests", "400", "--server", s.socket],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(0.5)
        s.kill()  # mid-run: the socket left behind, as a crash leaves it
        time.sleep(1.0)
        again = Server(tier="64M", slab="8M", socket=s.socket)
        out, _ = proc.communicate(timeout=120)
        again.stop()
        assert proc.returncode == 0, out
        last = out.strip().splitlines()[-1]
        assert "400 requests" in last and " 0 mismatches" in last
    finally:
        if proc.poll() is None:
            proc.kill()
        s.stop()


def test_the_examples_check_catches_a_wrong_byte():
    spec = importlib.util.spec_from_file_location("engine_loop", EXAMPLE)
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)

    class Args:
        server = None

    e = ex.Engine(Args())
    req = ex.Request("r", list(range(300)), e.layout)
    e.admit(req)
    e.compute(req, 256)
    e.verify(req, ex.kvstrand.TokenRange(0, 256))
    assert e.stats["mismatches"] == 0
    e.dev.view[1][req.blocks[5]][100] ^= 1
    e.verify(req, ex.kvstrand.TokenRange(0, 256))
    assert e.stats["mismatches"] == 1
    e.conn.close()


def test_the_example_describes_its_saves_and_the_server_announces_them():
    """--describe: every chunk the example saves reaches a KV-event
    subscriber as vLLM's BlockStored, with the example's block hashes and
    tokens (before, the example sent none and the events were silent)."""
    import pytest
    pytest.importorskip("zmq")
    from kv_event_subscriber import Subscriber, free_port
    port = free_port()
    s = Server(tier="64M", slab="8M", extra=["--events", f"tcp://127.0.0.1:{port}"])
    sub = Subscriber(f"tcp://127.0.0.1:{port}", None, "", "map")
    try:
        time.sleep(0.3)  # subscribed before the saves
        line = run("--requests", "8", "--server", s.socket, "--describe")
        assert " 0 mismatches" in line
        stored = s.metric('events_total{type="BlockStored"}')
        assert stored and stored > 0
        sub.receive(lambda x: sum(e["type"] == "BlockStored" for e in x.events()) >= stored)
        events = [e for e in sub.events() if e["type"] == "BlockStored"]
        assert all(e["block_size"] == 16 and len(e["block_hashes"]) == 4 and len(e["token_ids"]) == 64
                   for e in events)
    finally:
        sub.close()
        s.stop()
