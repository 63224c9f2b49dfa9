"""The module's pure parts: version, layouts and their validation, namespaces
and chunk keys, the planner, save tracking, and the exception types."""

import array
import copy
import pickle

import numpy as np
import pytest

import kvstrand
from conftest import make_layout


def test_version_and_backend():
    assert kvstrand.__version__ == kvstrand.version()
    assert kvstrand.__version__.count(".") == 2
    assert kvstrand.backend() in ("sim", "hip", "cuda")
    assert kvstrand.sim.available() == (kvstrand.backend() == "sim")


def test_exception_types_mirror_the_cpp_ones():
    for t in (kvstrand.TransferRefused, kvstrand.FailStop, kvstrand.ConfigError):
        assert issubclass(t, kvstrand.KvstrandError)
    assert issubclass(kvstrand.ConfigError, ValueError)
    assert not issubclass(kvstrand.FailStop, kvstrand.TransferRefused)
    assert not issubclass(kvstrand.TransferRefused, kvstrand.FailStop)


def test_layout_fields_and_derived_sizes():
    layout = make_layout(checkpoint=kvstrand.CheckpointSpec("ring", 512, 64))
    assert layout.has_state
    assert layout.blocks_per_chunk == 4
    assert layout.bytes_per_block == 4096
    assert layout.object_bytes(True) == 4 * 4096 + 512
    assert layout.object_bytes(False) == 4 * 4096
    assert layout.prefill_tail == 1
    layout.speculative = kvstrand.SpeculativeConfig("mtp", 1)
    assert layout.prefill_tail == 2
    other = copy.copy(layout)
    other.tp_rank = 3
    assert layout.tp_rank == 0  # a copy, not a view


def test_validate_names_the_option():
    kvstrand.validate(make_layout())
    with pytest.raises(kvstrand.ConfigError) as e:
        kvstrand.validate(make_layout(chunk_tokens=40))  # not a multiple of block_tokens
    assert e.value.option
    assert e.value.option in str(e.value)
    with pytest.raises(ValueError):  # ConfigError is a ValueError too
        kvstrand.validate(make_layout(planes=[]))


def test_namespace_covers_every_field_that_moves_bytes():
    ns = kvstrand.namespace_of(make_layout())
    assert isinstance(ns, bytes) and len(ns) == 32
    assert ns == kvstrand.namespace_of(make_layout())
    for change in (dict(dtype="fp8"), dict(model_id="other"), dict(tenant_salt="t"), dict(block_tokens=32),
                   dict(planes=[kvstrand.Plane("kv", 2048)]), dict(tp_size=2)):
        assert kvstrand.namespace_of(make_layout(**change)) != ns, change
    assert kvstrand.namespace_of(make_layout(tp_rank=0, tp_size=2)) == \
        kvstrand.namespace_of(make_layout(tp_rank=1, tp_size=2))  # the rank is in each key instead


def test_chunk_keys_from_lists_numpy_and_arrays_agree():
    layout = make_layout()
    tokens = list(range(1000, 1200))
    keys = kvstrand.chunk_keys(layout, tokens)
    assert len(keys) == 200 // 64  # only full chunks
    assert kvstrand.chunk_keys(layout, np.array(tokens, dtype=np.uint32)) == keys
    assert kvstrand.chunk_keys(layout, array.array("I", tokens)) == keys
    assert kvstrand.chunk_keys(layout, np.array(tokens, dtype=np.int64)) == keys  # converted
    assert kvstrand.chunk_keys(layout, np.array(tokens, dtype=np.uint32)[::2]) == \
        kvstrand.chunk_keys(layout, tokens[::2])  # a strided view is copied, not misread
    with pytest.raises(TypeError):
        kvstrand.chunk_keys(layout, [-1] * 64)
    growing = array.array("I", tokens)
    kvstrand.chunk_keys(layout, growing)
    growing.append(7)  # the buffer was held only during the call (a held one refuses to resize)


def test_chunk_keys_name_whole_prefixes():
    layout = make_layout()
    a = kvstrand.chunk_keys(layout, list(range(256)))
    b = kvstrand.chunk_keys(layout, list(range(128)) + [7] + list(range(129, 256)))
    assert a[:2] == b[:2] and a[2] != b[2] and a[3] != b[3]  # a change moves every later key
    assert all(k.kv_rank == 0 for k in a)
    assert {k.ns for k in a} == {kvstrand.namespace_of(layout)}
    rank1 = kvstrand.chunk_keys(make_layout(tp_size=2, tp_rank=1), list(range(256)))
    assert [k.kv_rank for k in rank1] == [1] * 4
    shared = make_layout(tp_size=2, tp_rank=1, replicated_across_tp=True)
    assert kvstrand.kv_rank_of(shared) == 0 and not kvstrand.writes_to_tier(shared)


def test_chunk_hashes_continue_from_a_previous_chunk():
    layout = make_layout()
    ns = kvstrand.namespace_of(layout)
    tokens = list(range(512))
    whole = kvstrand.chunk_hashes(ns, tokens, 64)
    first = kvstrand.chunk_hashes(ns, tokens[:192], 64)
    rest = kvstrand.chunk_hashes(ns, tokens[192:], 64, prev=first[-1])
    assert first + rest == whole
    assert [k.hash for k in kvstrand.chunk_keys(layout, tokens)] == whole
    with pytest.raises(ValueError):
        kvstrand.chunk_hashes(b"short", tokens, 64)


def test_chunk_keys_pickle_hash_and_compare():
    keys = kvstrand.chunk_keys(make_layout(), list(range(256)))
    assert pickle.loads(pickle.dumps(keys)) == keys
    assert len(set(keys) | set(pickle.loads(pickle.dumps(keys)))) == 4
    k = keys[0]
    assert kvstrand.ChunkKey(k.ns, k.kv_rank, k.hash) == k
    assert kvstrand.ChunkKey(k.ns, 1, k.hash) != k


def test_plan_hit_follows_the_planner_rules():
    layout = make_layout()
    plan = kvstrand.plan_hit(layout, prompt_tokens=300, hbm=kvstrand.HitSource(32),
                             tier=kvstrand.HitSource(256))
    assert plan.hbm_tokens == 32
    assert plan.load == kvstrand.TokenRange(32, 256)  # starts at the HBM frontier, ends on the chunk grid
    assert plan.frontier == 256
    # The prefill tail: a whole-prompt hit still leaves a token to compute.
    plan = kvstrand.plan_hit(layout, kvstrand.HitInputs(256, kvstrand.HitSource(0), kvstrand.HitSource(256)))
    assert plan.frontier == 192 and plan.load == kvstrand.TokenRange(0, 192)
    plan = kvstrand.plan_hit(layout, prompt_tokens=300, tier=None)
    assert plan.load is None and plan.no_load == kvstrand.NoLoad.no_tier_answer
    plan = kvstrand.plan_hit(layout, prompt_tokens=300, tier=kvstrand.HitSource(64), min_load_tokens=128)
    assert plan.load is None and plan.no_load == kvstrand.NoLoad.below_min_load
    # With recurrent state a hit ends where the tier holds a checkpoint.
    stateful = make_layout(checkpoint=kvstrand.CheckpointSpec("ring", 512, 64))
    plan = kvstrand.plan_hit(stateful, prompt_tokens=300, tier=kvstrand.HitSource(256, [64, 128]))
    assert plan.frontier == 128 and plan.state_from_tier


def test_plan_groups_resumes_where_every_group_can():
    target = make_layout()
    draft = make_layout(model_id="draft", planes=[kvstrand.Plane("kv", 1024)])
    plan = kvstrand.plan_groups([kvstrand.GroupHitInputs(target, tier=kvstrand.HitSource(256)),
                                 kvstrand.GroupHitInputs(draft, tier=kvstrand.HitSource(128))], 300)
    assert plan.frontier == 128
    assert [g.load for g in plan.groups] == [kvstrand.TokenRange(0, 128)] * 2
    assert kvstrand.plan_groups([kvstrand.GroupHitInputs(target, tier=kvstrand.HitSource(256)),
                                 kvstrand.GroupHitInputs(draft)], 300).frontier == 0


def test_budget_and_prefill_chunks():
    stateful = make_layout(checkpoint=kvstrand.CheckpointSpec("ring", 512, 64))
    kvstrand.validate_budget(stateful, 64)
    with pytest.raises(kvstrand.ConfigError):
        kvstrand.validate_budget(stateful, 32)
    assert kvstrand.prefill_chunk_end(stateful, 0, 100, 300) == 64
    assert kvstrand.prefill_chunk_end(stateful, 256, 100, 300) == 300


def test_save_tracker_saves_each_chunk_once_and_reopens_after_a_lost_load():
    t = kvstrand.SaveTracker(64)
    assert t.next_save(100) == kvstrand.TokenRange(0, 64)
    assert t.next_save(200) is None  # one save in flight
    t.save_settled(True)
    assert t.frontier == 64
    assert t.next_save(200) == kvstrand.TokenRange(64, 192)
    t.save_settled(False)
    assert t.next_save(200) == kvstrand.TokenRange(64, 192)  # a failed save is tried again
    t.save_settled(True)

    t = kvstrand.SaveTracker(64)
    t.load_decided(kvstrand.TokenRange(64, 256))
    assert t.loading and t.tier_attempt_spent and t.next_save(300) is None
    t.load_settled(kvstrand.LoadOutcome.failed)
    assert t.frontier == 64 and t.next_save(300) == kvstrand.TokenRange(64, 256)
    assert kvstrand.reopens_saves(kvstrand.LoadOutcome.failed)
    assert kvstrand.frees_lookup_locks_directly(kvstrand.LoadOutcome.withdrawn)
    assert not kvstrand.counts_as_transfer_failure(kvstrand.LoadOutcome.tier_lost)


def test_token_range():
    r = kvstrand.TokenRange(64, 192)
    assert len(r) == 128 and not r.empty and kvstrand.TokenRange(5, 5).empty
    assert pickle.loads(pickle.dumps(r)) == r and hash(r) == hash(kvstrand.TokenRange(64, 192))


def test_a_sim_build_on_a_machine_with_a_gpu_says_what_to_do(tmp_path):
    """A wheel built where auto found no toolkit is a sim build: on a GPU
    host every transfer of GPU memory fails. The module says so at import,
    naming the flag that builds the right one."""
    gpu = tmp_path / "nvidia0"
    gpu.write_text("")
    said = kvstrand._backend_problem("sim", (str(gpu),))
    assert said is not None and "KVSTRAND_GPU=cuda" in said and str(gpu) in said
    assert kvstrand._backend_problem("cuda", (str(gpu),)) is None
    assert kvstrand._backend_problem("sim", (str(tmp_path / "no-gpu"),)) is None
