"""kvstrand.vllm's KV events: the tier's blocks announced under vLLM's block
hashes (each rank's or one replicated), their loss, reset_cache, a save
announced only once every writing rank committed it and never when one
failed, vLLM's group index."""

import time
from types import SimpleNamespace

import pytest

import kvstrand
from conftest import Server
from kvstrand.vllm.events import BlockRemoved, BlockStored, EventLog, SaveEnded
from mini_vllm import MiniVllm, Request, block_hashes
from vllm_cases import HYBRID, PREFIX, newest_only


def stored_blocks(published):
    return [h for e in published if isinstance(e, BlockStored) for h in e.block_hashes]


@pytest.mark.parametrize("tp, replicated", [(1, False), (2, False), (2, True)])
def test_kv_events_announce_the_tiers_blocks_under_vllms_hashes_and_their_loss(server, tp, replicated):
    extra = {"replicated_across_tp": True} if replicated else {}
    vllm = MiniVllm(server.socket, tp=tp, caching=False, kv_events=True, **extra)
    a = vllm.add("a", PREFIX + list(range(40)))
    vllm.run()
    hashes = block_hashes(a, 16)  # the prompt's four chunks: 16 blocks
    stored = [e for e in vllm.published if isinstance(e, BlockStored)]
    assert stored_blocks(stored) == hashes  # each block once, in order, after every writing rank committed it
    assert all(e.medium == "CPU" and e.block_size == 16 and e.group_idx == 0 for e in stored)
    assert [t for e in stored for t in e.token_ids] == PREFIX
    assert stored[0].parent_block_hash is None
    assert all(e.parent_block_hash == hashes[hashes.index(e.block_hashes[0]) - 1] for e in stored[1:])
    if "kv_cache_spec_kind" in BlockStored.__dataclass_fields__:  # vLLM fills them where it has them
        assert all(e.kv_cache_spec_kind == "full_attention" and e.kv_cache_spec_sliding_window is None for e in stored)
    # The tier loses everything (its server restarted): the next lookup of
    # that prefix finds nothing, and the router hears that the blocks are gone.
    server.kill()
    again = Server(socket=server.socket)
    try:
        vllm.published.clear()
        vllm.add("b", PREFIX + list(range(500, 530)))
        vllm.run(timeout=60)
        removed = [e for e in vllm.published if isinstance(e, BlockRemoved)]
        assert [h for e in removed for h in e.block_hashes] == hashes and removed[0].medium == "CPU"
        assert stored_blocks(vllm.published) == hashes  # b stored them again
        assert vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    finally:
        vllm.shutdown()
        again.stop()


def test_kv_events_reset_cache_removes_all_announced_and_are_silent_when_vllm_publishes_none(server):
    vllm = MiniVllm(server.socket, caching=False, kv_events=True)
    a = vllm.add("a", PREFIX + [1])
    vllm.run()
    vllm.published.clear()
    vllm.scheduler.reset_cache()
    vllm.step()
    (removed,) = vllm.published
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == block_hashes(a, 16)
    vllm.shutdown()
    quiet = MiniVllm(server.socket, caching=False)
    quiet.add("b", PREFIX + [2])
    quiet.run()
    assert quiet.published == [] and quiet.workers[0].get_kv_connector_kv_cache_events() is None
    quiet.shutdown()


def test_a_save_is_announced_only_once_every_writing_rank_committed_it():
    log = EventLog(writers=[0, 1], block_size=16)
    req = Request("a", PREFIX, 1)
    for save_id, (b, e) in enumerate([(0, 64), (64, 128)], start=1):
        log.save_posted(save_id, 0, req, b, e, [bytes([save_id])])
    log.save_ended(SaveEnded(1, 0, 0, True))
    log.save_ended(SaveEnded(2, 0, 1, True))
    assert log.take() == []  # each save has one rank's word only
    log.save_ended(SaveEnded(2, 0, 0, False))  # rank 0 dropped save 2: never announced
    log.save_ended(SaveEnded(2, 0, 1, True))
    assert log.take() == []
    log.save_ended(SaveEnded(1, 0, 1, True))  # a step later, rank 1 committed save 1
    (stored,) = log.take()
    assert stored.block_hashes == block_hashes(req, 4) and stored.token_ids == PREFIX[:64]
    log.prefix_found(0, [bytes([1]), bytes([2])], 1)  # chunk 1 is still held: nothing removed
    assert log.take() == []
    log.prefix_found(0, [bytes([1]), bytes([2])], 0)
    (removed,) = log.take()
    assert removed.block_hashes == block_hashes(req, 4)


class _SavesFailOn:
    """A worker's Connector whose saves all end failed (as a copy or a
    commit that fails would)."""

    def __init__(self, conn):
        self.conn = conn

    def __getattr__(self, name):
        return getattr(self.conn, name)

    def finished(self):
        f = self.conn.finished()
        return SimpleNamespace(lookups=f.lookups, loads=f.loads, saves=[
            SimpleNamespace(request=o.request, registration=o.registration, ok=False, reason="test: failed")
            for o in f.saves])


def test_kv_events_never_announce_a_save_one_rank_failed(server):
    vllm = MiniVllm(server.socket, tp=2, caching=False, kv_events=True)
    rank1 = vllm.workers[1]._worker
    rank1.conn = _SavesFailOn(rank1.conn)
    vllm.add("a", PREFIX + [1])
    vllm.run()
    assert vllm.summed_stats()["saves_failed"] >= 1
    assert stored_blocks(vllm.published) == []
    vllm.shutdown()


@newest_only
def test_kv_events_name_vllms_group_index(block_server):
    # [Mamba, full attention]: kvstrand's group 0 is vLLM's group 1, the
    # index a router knows the blocks by.
    vllm = MiniVllm(block_server.socket, caching=False, kv_events=True, chunk_tokens=16,
                    groups=[("mamba", 1, 0), ("full", 2, 0)])
    vllm.add("a", PREFIX[:150])
    vllm.run()
    stored = [e for e in vllm.published if isinstance(e, BlockStored)]
    assert stored and {e.group_idx for e in stored} == {1}
    assert vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    vllm.shutdown()


@pytest.mark.parametrize("tp", [1, 2])
def test_with_tier_events_from_the_server_vllms_block_hashes_reach_its_subscribers_and_the_engine_announces_none(
        tmp_path, tp):
    pytest.importorskip("zmq", reason="the subscriber needs pyzmq (Debian's python3-zmq), which this Python lacks")
    from kv_event_subscriber import Subscriber, free_port
    port, replay = free_port(), free_port()
    endpoint, replay_endpoint = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}"
    server = Server(extra=["--events", endpoint, "--events-replay", replay_endpoint])
    sub = Subscriber(endpoint, replay_endpoint, "", "map")
    vllm = MiniVllm(server.socket, tp=tp, caching=False, kv_events=True, tier_events="server")
    try:
        a = vllm.add("a", PREFIX + list(range(40)))
        vllm.run()
        hashes = block_hashes(a, 16)
        end = time.monotonic() + 10
        while True:
            events = [e for batch in sub.replay(0).values() for e in batch]
            stored = [e for e in events if e["type"] == "BlockStored"]
            if sum(len(e["block_hashes"]) for e in stored) >= len(hashes) or time.monotonic() > end:
                break
            time.sleep(0.05)
        # Every rank's save has committed (run() returned): any second
        # announcement of a block (another rank's object) is in the replay too.
        stored = [e for batch in sub.replay(0).values() for e in batch if e["type"] == "BlockStored"]
        assert [h for e in stored for h in e["block_hashes"]] == hashes  # each block once, whatever the TP
        assert all(e["medium"] == "CPU" and e["block_size"] == 16 and e["group_idx"] == 0 for e in stored)
        assert all(e["kv_cache_spec_kind"] == "full_attention" and e.get("kv_cache_spec_sliding_window") is None
                   for e in stored)
        assert [t for e in stored for t in e["token_ids"]] == PREFIX
        assert stored[0]["parent_block_hash"] is None
        assert vllm.published == []  # the engine announces none of the tier's blocks itself
        assert vllm.stats["mismatches"] == 0
    finally:
        vllm.shutdown()
        sub.close()
        server.stop()


def test_tier_events_takes_engine_or_server_only():
    with pytest.raises(Exception, match="tier_events"):
        MiniVllm("/tmp/none.sock", tier_events="router")


@newest_only
def test_kv_events_say_each_groups_spec_kind_and_sliding_window_as_vllm_does(server):
    vllm = MiniVllm(server.socket, caching=False, kv_events=True, groups=HYBRID)
    try:
        vllm.add("a", PREFIX + list(range(40)))
        vllm.run()
        stored = [e for e in vllm.published if isinstance(e, BlockStored)]
        kinds = {(e.group_idx, e.kv_cache_spec_kind, e.kv_cache_spec_sliding_window) for e in stored}
        assert kinds == {(0, "full_attention", None), (1, "sliding_window", 32)}
        assert vllm.stats["mismatches"] == 0
    finally:
        vllm.shutdown()


def test_where_vllm_hashes_finer_than_a_block_events_carry_its_hash_of_each_block():
    """vLLM hashes a hybrid's blocks at hash_block_size (4 hashes a 16-token
    block here); its own BlockStored carries one hash a block (its
    BlockHashListWithBlockSize: the block's last sub-hash). Taking
    Request.block_hashes a block at a time announced hashes vLLM never did."""
    fine = [bytes([i]) * 8 for i in range(32)]  # 128 tokens at 4 a hash
    req = SimpleNamespace(block_hashes=fine, prompt_token_ids=PREFIX + list(range(64)), lora_request=None)
    log = EventLog(writers=[0], block_size=16, hash_block_size=4)
    log.save_posted(1, 0, req, 64, 128, [b"c"])
    log.save_ended(SaveEnded(1, 0, 0, True))
    (stored,) = log.take()
    assert stored.block_hashes == fine[3::4][4:8]
    assert stored.parent_block_hash == fine[15]
    # The server's descriptions of the same chunks, alike.
    from kvstrand.vllm.events import describe_chunks
    (desc,) = describe_chunks(req, 64, 128, 16, 64, 0, hash_block_size=4)
    assert fine[19] in desc and fine[16] not in desc


@newest_only
def test_the_hash_grain_is_vllms_own():
    from kvstrand.vllm.config import ConnectorConfig
    from mini_vllm_model import configs
    groups = [("full", 2, 0), ("sliding", 2, 32)]
    assert ConnectorConfig.from_vllm(*configs("/tmp/x.sock", 1, 64, 4, 64, groups=groups)).hash_block_size == 16
    fine = configs("/tmp/x.sock", 1, 64, 4, 64, groups=groups, hash_block_size=4)
    assert ConnectorConfig.from_vllm(*fine).hash_block_size == 4


def test_events_carry_each_blocks_extra_keys_as_vllm_fills_them():
    """A LoRA request with an image and a cache salt: vLLM's BlockStored
    lists, per block, what its hash covers besides tokens; kvstrand's said
    nothing (None) where this vLLM has the function that makes them."""
    req = Request("a", PREFIX + list(range(64)), 1, mm=[(20, 30, "img-1")], lora="adapter", salt="s")
    req.block_hashes  # noqa: B018 - computed as vLLM does, from the request
    log = EventLog(writers=[0], block_size=16)
    log.save_posted(1, 0, req, 0, 64, [b"c"])
    log.save_ended(SaveEnded(1, 0, 0, True))
    (stored,) = log.take()
    from kvstrand.vllm.events import vllm_helper
    if vllm_helper("generate_block_hash_extra_keys") is None:
        assert stored.extra_keys is None  # an older vLLM: its events have none either
        return
    assert stored.extra_keys == [("adapter", "s")] + [("img-1", "adapter")] * 3  # the image spans tokens 20-49
