"""The node tier through a real kvstrand-server: engines in this process and
in other Python processes share what is stored, and a lease looked up in one
process is loaded in another."""

import hashlib
import os
import subprocess
import sys
import time

import numpy as np
import pytest

import kvstrand
from conftest import BLOCK_BYTES, Engine, Server, pattern

PEER = os.path.join(os.path.dirname(__file__), "peer.py")
PEER_PROMPT = list(range(7000, 7128))  # peer.py's prompt


def peer(server, *args):
    r = subprocess.run([sys.executable, PEER, server.socket, *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"peer {args[0]} failed ({r.returncode}):\n{r.stdout}{r.stderr}"
    return r.stdout.strip().splitlines()[-1]


def node_engine(server):
    return Engine(server_socket=server.socket, server_request_timeout=5.0)


def test_two_engines_share_the_servers_arena_byte_for_byte(server):
    a, b = node_engine(server), node_engine(server)
    prompt = list(range(100, 228))
    a.blocks[0:8] = pattern(8 * BLOCK_BYTES, 5).reshape(8, BLOCK_BYTES)
    a.conn.save(a.spec("r", prompt, 0, 128))
    assert a.wait(saves=1)["saves"][0].ok
    b.conn.lookup(b.keys(prompt))
    answer = b.wait(lookups=1)["lookups"][0]
    assert answer.hit.tokens == 128 and answer.lease != 0  # the server pins the hit for the load
    b.conn.load(b.spec("r", prompt, 8, 128, tier_lease=answer.lease))
    assert b.wait(loads=1)["loads"][0].ok
    np.testing.assert_array_equal(b.blocks[8:16], a.blocks[0:8])
    a.close()
    b.close()


def test_what_one_process_stored_another_loads(server):
    assert peer(server, "save", "11") == "saved"  # and that process has exited
    e = node_engine(server)
    e.conn.lookup(e.keys(PEER_PROMPT))
    answer = e.wait(lookups=1)["lookups"][0]
    assert answer.hit.tokens == 128
    e.conn.load(e.spec("r", PEER_PROMPT, 0, 128, tier_lease=answer.lease))
    assert e.wait(loads=1)["loads"][0].ok
    np.testing.assert_array_equal(e.blocks[0:8].reshape(-1), pattern(8 * BLOCK_BYTES, 11))
    e.close()


def test_a_lookup_in_one_process_is_loaded_in_another(server):
    # This process plays the scheduler: it looks up and hands the lease over;
    # the peer adopts it and loads.
    e = node_engine(server)
    e.blocks[0:8] = pattern(8 * BLOCK_BYTES, 12).reshape(8, BLOCK_BYTES)
    e.conn.save(e.spec("w", PEER_PROMPT, 0, 128))
    assert e.wait(saves=1)["saves"][0].ok
    scheduler = kvstrand.Connector(server_socket=server.socket, server_request_timeout=5.0)
    group = scheduler.register_layout(kvstrand.Registration(e.layout))  # no memory: lookups only
    scheduler.lookup(e.keys(PEER_PROMPT), group)
    answer = None
    for _ in range(5000):
        f = scheduler.finished()
        if f.lookups:
            answer = f.lookups[0]
            break
        time.sleep(0.002)
    assert answer is not None and answer.hit.tokens == 128 and answer.lease != 0
    handoff = scheduler.export_lease(answer.lease)
    assert isinstance(handoff, bytes) and handoff
    digest = peer(server, "adopt", handoff.hex())
    assert digest == hashlib.sha256(e.blocks[0:8].tobytes()).hexdigest()
    # Adopted once: the same bytes again are a miss, not a second lease.
    again = e.conn.adopt_lease(handoff)
    assert e.wait(lookups=1)["lookups"][0].id == again
    assert e.seen[-1].lookups[0].lease == 0
    scheduler.close()
    e.close()


def test_a_server_sigkilled_under_a_save_fails_it_cleanly_and_a_restarted_one_serves(server):
    e = node_engine(server)
    prompt = list(range(300, 428))
    e.blocks[0:8] = pattern(8 * BLOCK_BYTES, 13).reshape(8, BLOCK_BYTES)
    stream = kvstrand.DeviceStream()
    kvstrand.sim.hold_stream(stream.native)  # the save waits for the step's forward pass
    e.conn.save(e.spec("r", prompt, 0, 128), kvstrand.Producer.after_stream(stream.native))
    server.kill()
    kvstrand.sim.release_stream(stream.native)
    out = e.wait(saves=1)["saves"][0]
    assert not out.ok and out.error == kvstrand.TransferErrc.tier_unavailable, out.reason  # no fail-stop
    restarted = Server(socket=server.socket)
    try:
        # The Connector reconnects on a request once its backoff since the
        # failed attempt has passed (50 ms, doubling, at most 2 s); saves in
        # between are dropped at once. A few fast attempts can all fall
        # inside it (CI saw five do), so try for longer than the longest one.
        deadline = time.monotonic() + 10
        attempt = 0
        while True:
            e.conn.save(e.spec(f"r{attempt}", prompt, 0, 128))
            if e.wait(saves=1)["saves"][0].ok:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"no save succeeded on the restarted server in {attempt + 1} attempts over 10 s")
            attempt += 1
            time.sleep(0.02)
        e.conn.lookup(e.keys(prompt))
        answer = e.wait(lookups=1)["lookups"][0]
        e.conn.load(e.spec("l", prompt, 16, 128, tier_lease=answer.lease))
        assert e.wait(loads=1)["loads"][0].ok
        np.testing.assert_array_equal(e.blocks[16:24], e.blocks[0:8])
    finally:
        e.close()
        restarted.stop()


def test_an_engine_started_before_its_server_misses_then_saves_and_hits_once_it_is_up(tmp_path):
    # Before: registering raised TransferRefused (tier_unavailable) and the
    # engine stopped. The tier is a cache: its absence costs hits only.
    path = str(tmp_path / "later.sock")
    e = Engine(server_socket=path, server_request_timeout=1.0)
    prompt = list(range(300, 428))
    try:
        e.conn.lookup(e.keys(prompt))
        assert e.wait(lookups=1)["lookups"][0].hit.tokens == 0
        e.blocks[0:8] = pattern(8 * BLOCK_BYTES, 9).reshape(8, BLOCK_BYTES)
        e.conn.save(e.spec("early", prompt, 0, 128))
        early = e.wait(saves=1)["saves"][0]
        assert not early.ok and early.error == kvstrand.TransferErrc.tier_unavailable
        assert path in early.reason and "No such file or directory" in early.reason, early.reason
        time.sleep(2)
        server = Server(socket=path)
        try:
            for attempt in range(40):  # attached within the connector's backoff (2 s at most)
                e.conn.save(e.spec(f"s{attempt}", prompt, 0, 128))
                if e.wait(saves=1)["saves"][0].ok:
                    break
                time.sleep(0.1)
            else:
                raise AssertionError("no save succeeded once the server was up")
            e.conn.lookup(e.keys(prompt))
            answer = e.wait(lookups=1)["lookups"][0]
            assert answer.hit.tokens == 128
            e.conn.load(e.spec("l", prompt, 16, 128, tier_lease=answer.lease))
            assert e.wait(loads=1)["loads"][0].ok
            np.testing.assert_array_equal(e.blocks[16:24], e.blocks[0:8])
        finally:
            e.close()
            server.stop()
    finally:
        e.close()


def test_a_layout_the_server_refuses_carries_the_servers_words():
    # The README's first Python mistake: a 64-token loop on a 256-token server.
    wide = Server(chunk_tokens=256)
    try:
        with pytest.raises(kvstrand.TransferRefused) as e:
            Engine(server_socket=wide.socket, server_request_timeout=5.0)  # chunk_tokens 64
        text = str(e.value)
        assert "chunk_tokens 64 differs from the server's --chunk-tokens 256" in text, text
        assert wide.socket in text, text
        assert text.count("does not fit") <= 1, text  # the code's own text once, not repeated
    finally:
        wide.stop()
