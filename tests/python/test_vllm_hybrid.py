"""kvstrand.vllm with hybrid models (the newest vLLM picture): sliding-window
and Mamba groups as --mamba-cache-mode align runs them resume byte exact, a
hit is capped where a state is stored, checkpoints only where a step ended,
a failed load recomputed, the Mamba state saved from the block vLLM hands
over, vLLM's strided hybrid attention layout."""

import pytest

import kvstrand
import kvstrand.vllm as kv_vllm
from mini_vllm import NULL, FakeTensor, MiniVllm, configs
from vllm_cases import BLOCK_ELEMS, HYBRID, MAMBA, PREFIX, newest_only, oldest_only, spoil_leases


@newest_only
@pytest.mark.parametrize("tp", [1, 2])
def test_a_hybrid_model_resumes_each_group_byte_exact(server, tp):
    # Full attention plus a 32-token sliding window (vLLM's hybrid allocator):
    # the window's group loads only the blocks inside the window.
    vllm = MiniVllm(server.socket, tp=tp, caching=False, groups=HYBRID, hybrid_invalid_blocks=True)
    loads = []
    vllm.meta_hook = lambda meta: loads.extend(meta.loads)
    vllm.add("a", PREFIX + list(range(40)))
    vllm.run()
    vllm.add("b", PREFIX + list(range(500, 530)))
    vllm.run()
    assert vllm.stats["resumed"] == 1 and vllm.stats["loaded_tokens"] == 256
    assert vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    (job,) = loads
    assert [(p.group, p.begin, p.end) for p in job.parts] == [(0, 0, 256), (1, 224, 256)]
    assert NULL not in job.block_ids
    vllm.shutdown()


@newest_only
def test_a_hybrid_models_failed_load_is_recomputed_where_vllm_can(server):
    vllm = MiniVllm(server.socket, caching=False, groups=HYBRID, hybrid_invalid_blocks=True)
    vllm.add("a", PREFIX + [7])
    vllm.run()
    vllm.meta_hook = spoil_leases(0, [], groups={1})  # the window group's lease
    vllm.add("b", PREFIX + [8])
    vllm.run()
    assert vllm.stats["load_errors"] >= 1 and vllm.stats["resumed"] == 0
    assert vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    vllm.shutdown()


def mamba_engine(server, **kw):
    """A Mamba-hybrid model under a vLLM without the external-KV assert, no
    local prefix cache (so a second request of a prompt loads from the tier)."""
    kw.setdefault("chunk_tokens", 16)
    kw.setdefault("budget", 64)
    return MiniVllm(server.socket, caching=False, groups=MAMBA, hybrid_invalid_blocks=True,
                    mamba_external_assert=False, **kw)


@newest_only
@pytest.mark.parametrize("tp", [1, 2])
# planes_per_layer 1 describes the same layout (a Mamba hybrid's attention
# caches are one region a block, K and V adjacent): it was refused as "the
# KV cache tensor is not contiguous", naming neither the option nor a fix.
@pytest.mark.parametrize("planes", [2, 1], ids=["planes2", "planes1"])
def test_the_seeds_shape_resumes_kv_and_mamba_state_byte_exact_from_the_tier(block_server, tp, planes):
    # Steps end on the block grid (64-token budget): 0-64, 64-128, then the
    # prompt's last whole block 128-144 (vLLM forces it to be a step end),
    # then 144-150. Each save carries the state of the chunk its step ended
    # on, so the tier holds 144 tokens with checkpoints at 64, 128 and 144.
    vllm = mamba_engine(block_server, tp=tp, planes_per_layer=planes)
    loads = []
    vllm.meta_hook = lambda meta: loads.extend(meta.loads)
    prompt = PREFIX[:150]
    vllm.add("a", prompt)
    vllm.run()
    b = vllm.add("b", prompt)
    vllm.run()
    assert b.loaded == (0, 144) and vllm.stats["resumed"] == 1
    assert vllm.stats["mismatches"] == 0 and not vllm.mismatched and vllm.all_blocks_free()
    (job,) = loads
    (part,) = job.parts  # the attention group's blocks, and the state into each Mamba group's block at 144
    assert (part.group, part.begin, part.end) == (0, 0, 144) and len(part.state_slots) == 2
    assert NULL not in part.state_slots
    vllm.shutdown()


@newest_only
def test_a_tier_hit_is_capped_to_a_chunk_end_whose_state_is_stored(server):
    # 64-token chunks: steps end at 64, 128 and 144, so chunk ends 64 and
    # 128 have a state and the tier's KV hit of a prompt sharing 140 tokens
    # (128) is loaded whole; one sharing 100 tokens holds KV to 64 only.
    # One sharing 40: its hit (none: chunk 0 is 64 tokens) loads nothing.
    vllm = mamba_engine(server, chunk_tokens=64)
    vllm.add("a", PREFIX[:150])
    vllm.run()
    loaded = {}
    for name, shared in (("b", 140), ("c", 100), ("d", 40)):
        loaded[name] = vllm.add(name, PREFIX[:shared] + list(range(5000, 5030)))
        vllm.run()
    assert [loaded[n].loaded for n in "bcd"] == [(0, 128), (0, 64), None]
    assert vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    vllm.shutdown()


@newest_only
def test_a_checkpoint_is_only_where_a_step_ended(block_server):
    # A 40-token budget cuts prefill at 32, 64, 96, 128, 144: with 16-token
    # chunks the saves of [0, 32) carry no state at 16. A prompt sharing 24
    # tokens finds KV at 16 but no state there: nothing is loaded, nothing
    # is wrong.
    vllm = mamba_engine(block_server, budget=40)
    vllm.add("a", PREFIX[:150])
    vllm.run()
    b = vllm.add("b", PREFIX[:24] + list(range(7000, 7040)))
    vllm.run()
    c = vllm.add("c", PREFIX[:40] + list(range(7000, 7040)))
    vllm.run()
    assert b.loaded is None and c.loaded == (0, 32)
    assert vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    vllm.shutdown()


@newest_only
@pytest.mark.parametrize("spec_tokens, loaded", [(0, (0, 144)), (1, (0, 128))])
def test_speculative_decoding_keeps_a_prefill_tail_of_two_tokens(block_server, spec_tokens, loaded):
    # A 145-token prompt: without speculation the hit may end at 144 (one
    # token left to compute); under speculative decoding at least two are
    # left, so the hit falls back to the checkpoint at 128.
    vllm = mamba_engine(block_server, spec_tokens=spec_tokens)
    vllm.add("a", PREFIX[:145])
    vllm.run()
    b = vllm.add("b", PREFIX[:145])
    vllm.run()
    assert b.loaded == loaded
    assert vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    vllm.shutdown()


@oldest_only
def test_a_vllm_that_asserts_no_external_kv_for_mamba_stops_as_kvstrand_refuses_it_at_start(block_server, monkeypatch):
    # Why the start-up check exists: with the checks passed over, the
    # miniature asserts as vLLM through 0.22 does, and the first tier hit
    # stops the engine core.
    monkeypatch.setattr(kv_vllm.config, "vllm_loads_external_mamba_state", lambda: None)
    monkeypatch.setattr(kv_vllm.config, "vllm_recovers_hybrid_load_errors", lambda: None)
    vllm = MiniVllm(block_server.socket, caching=False, groups=MAMBA, hybrid_invalid_blocks=True, chunk_tokens=16)
    vllm.add("a", PREFIX[:150])
    vllm.run()
    vllm.add("b", PREFIX[:150])
    with pytest.raises(AssertionError, match="External KV connector is not verified yet"):
        vllm.run()
    vllm.shutdown()


@newest_only
def test_a_mamba_state_is_saved_from_the_block_vllm_hands_over_not_the_tables_position(block_server):
    # The newest picture writes each boundary state into a copy-on-write
    # block that replaces the table entry at the step's end and frees the
    # block the connector was shown for that position. Saved from the
    # position (before), the tier held the wrong states under valid keys and
    # the resumed request's state differed.
    vllm = mamba_engine(block_server)
    saves = []
    vllm.meta_hook = lambda meta: saves.extend(meta.saves)
    vllm.add("a", PREFIX[:150])
    vllm.run()
    saved = {s for job in saves for p in job.parts for s in p.state_slots if s >= 0}
    assert saved and saved <= {block for _, block, _ in vllm.offered}  # each one a block vLLM handed over
    b = vllm.add("b", PREFIX[:150])
    vllm.run()
    assert b.loaded == (0, 144) and vllm.stats["mismatches"] == 0 and not vllm.mismatched
    vllm.shutdown()


@newest_only
def test_a_hybrid_attention_tensor_is_registered_in_vllms_strided_layout(block_server):
    # vLLM re-strides a Mamba hybrid's attention caches so K and V of a block
    # are adjacent (not contiguous); before, registration refused them. A
    # tensor strided otherwise is refused naming the layout it expected.
    vllm = mamba_engine(block_server)
    t = vllm.caches[0][0][0]
    assert not t.is_contiguous() and (t.stride(0), t.stride(1)) == (BLOCK_ELEMS, 2 * BLOCK_ELEMS)
    vllm.shutdown()
    vllm_config, kv_cache_config = configs(block_server.socket, 1, 64, 2, 16, groups=MAMBA)
    worker = kv_vllm.KvstrandConnector(vllm_config, kv_vllm.KVConnectorRole.WORKER, kv_cache_config, tp_rank=0)
    plain = FakeTensor(2, 64)  # (2, num_blocks, ...) contiguous: K planes, then V planes
    with pytest.raises(kvstrand.ConfigError, match="not vLLM's hybrid layout"):
        worker.register_kv_caches({name: plain for g in kv_cache_config.kv_cache_groups for name in g.layer_names})
    worker.shutdown()
