"""A subscriber to KV events written from vLLM's event schema
(vllm/distributed/kv_events.py: KVEventBatch of BlockStored, BlockRemoved,
AllBlocksCleared; ZmqEventPublisher's three frames and its replay), with
Debian's pyzmq and msgpack: what a prefix-aware router reads."""

import socket as pysocket
import time
from collections import Counter

import msgpack
import zmq

# vLLM's field order (the positional encoding of its releases before PR 42892).
STORED = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
          "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"]
REMOVED = ["block_hashes", "medium", "group_idx"]


def free_port():
    with pysocket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def decode_batch(payload, fmt):
    """A batch as (ts, [event dicts with "type"]), whatever vLLM shape `fmt` is."""
    batch = msgpack.unpackb(payload, raw=False)
    if fmt == "map":
        assert isinstance(batch, dict) and set(batch) >= {"ts", "events"}
        ts, events = batch["ts"], batch["events"]
    else:
        assert isinstance(batch, list) and len(batch) >= 2
        ts, events = batch[0], batch[1]
    out = []
    for e in events:
        if fmt == "array":
            assert isinstance(e, list)
            names = {"BlockStored": STORED, "BlockRemoved": REMOVED, "AllBlocksCleared": []}[e[0]]
            d = dict(zip(names, e[1:]))
            d["type"] = e[0]
        else:
            assert isinstance(e, dict) and "type" in e
            d = dict(e)
        if d["type"] == "BlockStored":  # fields without a default are always sent
            assert set(STORED[:7]) <= set(d), d
        out.append(d)
    return ts, out


class Subscriber:
    def __init__(self, endpoint, replay, topic, fmt):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self.sub.connect(endpoint)
        self.replay_endpoint, self.topic, self.fmt = replay, topic, fmt
        self.batches = {}  # seq -> events

    def receive(self, until, timeout=20.0):
        """Batches until `until(self)` holds. With a replay endpoint, what the
        live stream dropped (a subscriber that joined late, or fell behind on
        a loaded host) is asked of the replay every 2 s, as vLLM's consumers
        do: what the server published is what counts, not PUB/SUB's delivery."""
        end = time.monotonic() + timeout
        next_replay = time.monotonic() + 2
        while not until(self):
            assert time.monotonic() < end, (
                f"waited {timeout} s for the events; have "
                f"{Counter((e['type'], e.get('medium')) for e in self.events())}")
            if self.sub.poll(100):
                topic, seq, payload = self.sub.recv_multipart()
                assert topic == self.topic.encode()
                self.batches[int.from_bytes(seq, "big")] = decode_batch(payload, self.fmt)[1]
            elif self.replay_endpoint and time.monotonic() >= next_replay:
                self.batches.update(self.replay(0))
                next_replay = time.monotonic() + 2

    def replay(self, first=0):
        """vLLM's replay: a DEALER sends the first sequence number wanted; batches come back until seq -1."""
        d = self.ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)  # a failed replay must not hold the context's end
        try:
            d.connect(self.replay_endpoint)
            d.send_multipart([b"", first.to_bytes(8, "big")])
            got = {}
            while True:
                assert d.poll(5000), "no replay answer in 5 s"
                _, seq, payload = d.recv_multipart()
                seq = int.from_bytes(seq, "big", signed=True)
                if seq == -1:
                    assert payload == b""
                    break
                got[seq] = decode_batch(payload, self.fmt)[1]
        finally:
            d.close(0)
        return got

    def events(self):
        return [e for seq in sorted(self.batches) for e in self.batches[seq]]

    def close(self):
        self.sub.close(0)
        self.ctx.term()
