"""kvstrand-server's KV events (--events), read by a subscriber written from
vLLM's event schema (vllm/distributed/kv_events.py: KVEventBatch of
BlockStored, BlockRemoved, AllBlocksCleared; ZmqEventPublisher's frames and
replay), with Debian's pyzmq and msgpack: two engines store through one
server; every chunk is announced stored with the engine's block hashes on
the arena ("CPU") and, once written, the disk ("DISK"); evictions are
announced removed; batches are numbered from 0 without a gap; a replay
returns them; a restarted server's first batch clears and announces what
its disk still holds."""

import time
from collections import Counter

import msgpack
import pytest

import kvstrand
from conftest import Server
from kv_event_subscriber import Subscriber, free_port

PROMPT_TOKENS = 512  # 8 chunks of 64 tokens, 32 blocks of 16


def hashes_of(engine_id, prompt_id, chunk):
    """The engine's four vLLM block hashes of a chunk: bytes (newer vLLM) for engine 0, ints for engine 1."""
    out = []
    for b in range(4):
        n = (engine_id * 1000 + prompt_id) * 100 + chunk * 4 + b
        out.append(n.to_bytes(32, "big") if engine_id == 0 else n)
    return out


def description(engine_id, prompt_id, chunk, tokens):
    """What kvstrand.vllm sends for a chunk (docs/events.md), from vLLM's own values."""
    prev = hashes_of(engine_id, prompt_id, chunk - 1)[-1] if chunk else None
    return msgpack.packb({"block_hashes": hashes_of(engine_id, prompt_id, chunk), "parent_block_hash": prev,
                          "token_ids": tokens[chunk * 64:(chunk + 1) * 64], "block_size": 16, "lora_id": None,
                          "lora_name": None, "group_idx": 0}, use_bin_type=True)


class EventEngine:
    def __init__(self, server, engine_id):
        from conftest import BLOCK_BYTES, BLOCKS, make_layout
        self.id = engine_id
        self.layout = make_layout(model_id=f"events-{engine_id}")
        self.memory = kvstrand.sim.allocate(BLOCKS * BLOCK_BYTES)
        self.conn = kvstrand.Connector(server_socket=server.socket, server_request_timeout=5.0,
                                       transfer_deadline=20.0)
        self.group = self.conn.register_layout(
            kvstrand.Registration(self.layout, [kvstrand.PlaneMemory(self.memory.address, BLOCKS)]))

    def save(self, prompt_id, describe=True):
        tokens = [self.id * 100000 + prompt_id * 1000 + t for t in range(PROMPT_TOKENS)]
        keys = kvstrand.chunk_keys(self.layout, tokens)
        spec = kvstrand.TransferSpec(request=f"e{self.id}-p{prompt_id}", registration=self.group,
                                     tokens=kvstrand.TokenRange(0, PROMPT_TOKENS), keys=keys,
                                     blocks=list(range(PROMPT_TOKENS // 16)))
        if describe:
            spec.chunk_events = [description(self.id, prompt_id, c, tokens) for c in range(len(keys))]
        self.conn.save(spec)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            f = self.conn.finished()
            if f.saves:
                assert f.saves[0].ok, f.saves[0].reason
                return
            time.sleep(0.002)
        raise AssertionError("save not finished in 20 s")

    def close(self):
        self.conn.close()


def key(h):
    return tuple(x if isinstance(x, int) else bytes(x) for x in h)


def written(server):
    """Waits until the disk wrote everything queued; returns how many objects it wrote."""
    end = time.monotonic() + 30
    while server.metric("disk_write_queue") != 0 or server.metric("disk_in_flight") != 0:
        assert time.monotonic() < end, "the disk did not drain in 30 s"
        time.sleep(0.02)
    return server.metric("disk_written_total")


@pytest.mark.parametrize("fmt", ["map", "events-map", "array"])
def test_two_engines_stores_evictions_and_a_restart_as_vllm_events(fmt, tmp_path):
    port, replay_port = free_port(), free_port()
    endpoint, replay = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}"
    flags = ["--events", endpoint, "--events-replay", replay, "--events-topic", "kv-events", "--events-format", fmt,
             "--disk", str(tmp_path), "--disk-bytes", "64M"]
    server = Server(tier="4M", slab="2M", extra=flags)
    sub = Subscriber(endpoint, replay, "kv-events", fmt)
    engines = [EventEngine(server, 0), EventEngine(server, 1)]
    try:
        # The first batch (sent before any subscriber could join) comes back by replay.
        first = sub.replay(0)
        assert first[0] == [{"type": "AllBlocksCleared"}]
        time.sleep(0.3)  # the subscription reaches the server before the stores
        saved = {}  # block hashes of a chunk -> (engine, prompt, chunk)
        for p in range(20):  # 320 objects of 16 KiB: more than the 4 MiB arena's 256
            for e in engines:
                e.save(p)
                for c in range(8):
                    saved[key(hashes_of(e.id, p, c))] = (e.id, p, c)
        # Drained first: a loaded host's disk drops some writes (the queue
        # full), so what was written is counted, not assumed.
        on_disk = written(server)
        # One more, without descriptions: stored, written, never announced.
        engines[0].save(99, describe=False)
        all_written = written(server)
        assert server.metric("evictions_total") > 0
        removed_total = server.metric('events_total{type="BlockRemoved"}')

        def complete(s):
            count = Counter((e["type"], e.get("medium")) for e in s.events())
            return (count[("BlockStored", "CPU")] >= len(saved) and count[("BlockStored", "DISK")] >= on_disk and
                    count[("BlockRemoved", "CPU")] >= removed_total)
        sub.receive(complete)
        seqs = sorted(sub.batches)
        assert seqs == list(range(seqs[0], seqs[-1] + 1)), "a gap in the sequence numbers"
        events = sub.events()
        cpu = [key(e["block_hashes"]) for e in events if e["type"] == "BlockStored" and e["medium"] == "CPU"]
        disk = [key(e["block_hashes"]) for e in events if e["type"] == "BlockStored" and e["medium"] == "DISK"]
        assert Counter(cpu) == Counter(saved.keys()), "every chunk of both engines announced stored once on CPU"
        assert len(disk) == on_disk and set(disk) <= set(saved)
        for e in events:
            if e["type"] != "BlockStored":
                continue
            eid, p, c = saved[key(e["block_hashes"])]
            tokens = [eid * 100000 + p * 1000 + t for t in range(PROMPT_TOKENS)]
            assert e["token_ids"] == tokens[c * 64:(c + 1) * 64] and e["block_size"] == 16
            assert e["parent_block_hash"] == (hashes_of(eid, p, c - 1)[-1] if c else None)
            assert e.get("group_idx") == 0 and e["lora_id"] is None
        # Evictions: removed on CPU, each a chunk announced before, never twice.
        removed = [key(e["block_hashes"]) for e in events if e["type"] == "BlockRemoved"]
        assert removed and all(e["medium"] == "CPU" for e in events if e["type"] == "BlockRemoved")
        assert set(removed) <= set(cpu) and len(set(removed)) == len(removed)
        assert removed_total == len(removed)
        # The replay holds the same batches.
        again = sub.replay(seqs[0])
        assert {s: again[s] for s in seqs} == {s: sub.batches[s] for s in seqs}

        # A restart (SIGKILL): the disk's objects come back, announced first thing.
        for e in engines:
            e.close()
        engines = []
        server.kill()
        server = Server(tier="4M", slab="2M", socket=server.socket, extra=flags)
        recovered = sub.replay(0)
        assert min(recovered) == 0
        batch0 = recovered[0]
        assert batch0[0] == {"type": "AllBlocksCleared"}
        back = [key(e["block_hashes"]) for e in batch0[1:]]
        assert all(e["type"] == "BlockStored" and e["medium"] == "DISK" for e in batch0[1:])
        assert Counter(back) == Counter(disk), "every described object on the disk, with its hashes"
        assert server.metric("disk_recovered_objects_total") == all_written  # prompt 99's too, undescribed
    finally:
        for e in engines:
            e.close()
        sub.close()
        server.stop()


def test_a_bad_description_stores_the_chunk_unannounced_and_is_counted(tmp_path):
    port = free_port()
    server = Server(tier="4M", slab="2M", extra=["--events", f"tcp://127.0.0.1:{port}"])
    e = EventEngine(server, 0)
    try:
        tokens = list(range(PROMPT_TOKENS))
        keys = kvstrand.chunk_keys(e.layout, tokens)
        spec = kvstrand.TransferSpec(request="bad", registration=e.group, tokens=kvstrand.TokenRange(0, 64),
                                     keys=keys[:1], blocks=list(range(4)))
        spec.chunk_events = [msgpack.packb({"token_ids": [1, 2]})]  # no block_hashes
        e.conn.save(spec)
        end = time.monotonic() + 10
        while not (f := e.conn.finished()).saves:
            assert time.monotonic() < end
            time.sleep(0.002)
        assert f.saves[0].ok
        assert server.metric("event_descriptions_refused_total") == 1
        assert server.metric('events_total{type="BlockStored"}') == 0
        assert server.tier()["objects"] == 1
    finally:
        e.close()
        server.stop()


def test_a_server_without_events_takes_described_saves():
    server = Server(tier="4M", slab="2M")
    e = EventEngine(server, 0)
    try:
        e.save(1)
        assert server.metric("events_total") is None and server.tier()["objects"] == 8
    finally:
        e.close()
        server.stop()
