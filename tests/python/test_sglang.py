"""kvstrand.sglang against a picture of SGLang (KVSTRAND_SGLANG_PICTURE:
sglang_pictures/oldest or newest): loaded by SGLang's dynamic-backend
factory, driven in SGLang's call order by mini_sglang.py's ranks, every
resumed page checked against a recompute."""

import os
import time

import numpy as np
import pytest

import mini_sglang  # first: it puts the picture of SGLang on sys.path
from conftest import Server

import kvstrand
from kvstrand.sglang import KvstrandStorage
from kvstrand.sglang.interface import HiCacheStorage

PAGE = 16


@pytest.fixture
def page_server():
    """A server whose chunks are SGLang's 16-token pages."""
    s = Server(chunk_tokens=PAGE)
    yield s
    s.stop()


def prompt(seed, pages, shared=0):
    """`pages` pages of tokens, the first `shared` pages common to every seed."""
    common = list(range(10_000, 10_000 + shared * PAGE))
    return common + [seed * 100_000 + i for i in range((pages - shared) * PAGE)]


def test_sglang_loads_it_by_its_dynamic_backend_flags(page_server):
    e = mini_sglang.MiniSGLang(page_server.socket)
    try:
        backend = e.backend()
        assert isinstance(backend, KvstrandStorage)
        assert issubclass(KvstrandStorage, mini_sglang.storage.HiCacheStorage)  # the factory's own check passed
        assert HiCacheStorage is mini_sglang.storage.HiCacheStorage
    finally:
        e.close()


@pytest.mark.parametrize("extra, option", [
    ({"sever_socket": "/tmp/x"}, "sever_socket"),
    ({"server_socket": ""}, "server_socket"),
    ({"copy_threads": -1}, "copy_threads"),
    ({"copy_threads": "4"}, "copy_threads"),
    ({"tenant": "team a"}, "tenant"),
    ({"lease_bound_s": 0}, "lease_bound_s"),
    ({"public_tenant": "team a"}, "public_tenant"),
    ({"public_tenant": "team-a", "tenant": "team-a"}, "public_tenant"),
])
def test_a_bad_extra_config_key_is_refused_at_construction_naming_it(page_server, extra, option):
    with pytest.raises(kvstrand.ConfigError) as e:
        mini_sglang.MiniSGLang(page_server.socket, **extra)
    assert e.value.option == "hicache-storage-backend-extra-config." + option


def test_a_public_tenant_the_server_does_not_publish_leaves_the_engine_its_own_pages(page_server):
    # kvstrand.sglang's public_tenant against a server without --public-tenant:
    # the reading session is refused (said once), and every page is this engine's own.
    e = mini_sglang.MiniSGLang(page_server.socket, tenant="team-b", public_tenant="shared")
    try:
        assert e.serve(prompt(1, 4)) == 0
        assert e.serve(prompt(1, 4)) == 4
        stats = e.backend().kvstrand_stats()
        assert stats["public_pages_read"] == 0 and stats["pages_read"] == 4
        assert e.mismatches == 0
    finally:
        e.close()


@pytest.mark.parametrize("layout, mla", [("page_first", False), ("layer_first", False),
                                         ("page_first_direct", False), ("page_head", False), ("page_first", True)])
def test_a_restarted_instance_resumes_its_prefixes_byte_for_byte(page_server, layout, mla):
    first = mini_sglang.MiniSGLang(page_server.socket, layout=layout, mla=mla)
    try:
        assert first.serve(prompt(1, 6, shared=3)) == 0
        assert first.serve(prompt(2, 5, shared=3)) == 3  # the shared pages, from the tier
    finally:
        first.close()
    again = mini_sglang.MiniSGLang(page_server.socket, layout=layout, mla=mla)  # SGLang restarted
    try:
        assert again.serve(prompt(1, 6, shared=3)) == 6
        assert again.serve(prompt(2, 7, shared=3)) == 5
        assert first.mismatches == 0 and again.mismatches == 0
    finally:
        again.close()


def test_each_tp_rank_reads_its_own_pages_and_a_rank_without_a_server_shortens_every_rank(page_server, tmp_path):
    nowhere = str(tmp_path / "no-server.sock")
    # Rank 1 cannot reach a server for the first request: only rank 0's pages are stored.
    half = mini_sglang.MiniSGLang(page_server.socket, tp=2, sockets={1: nowhere}, request_timeout_s=1.0)
    try:
        assert half.serve(prompt(1, 4)) == 0
        assert half.backend(1).kvstrand_stats()["pages_not_stored"] == 4  # never a raise, never None
    finally:
        half.close()
    both = mini_sglang.MiniSGLang(page_server.socket, tp=2)
    try:
        # Rank 0 holds all 4 pages, rank 1 none of its own (rank 0's are not
        # its): SGLang's MIN makes it a miss for both.
        assert len(both.ranks[0].ctrl.storage_hit_query(mini_sglang.page_hashes(prompt(1, 4), PAGE))) == 4
        assert both.serve(prompt(1, 4)) == 0
        assert both.serve(prompt(1, 4)) == 4
        assert both.mismatches == 0
    finally:
        both.close()


def test_mla_is_written_by_rank_0_alone_and_read_by_every_rank(page_server):
    e = mini_sglang.MiniSGLang(page_server.socket, tp=2, mla=True)
    try:
        assert e.serve(prompt(1, 5)) == 0
        assert e.backend(0).kvstrand_stats()["pages_written"] == 5
        assert e.backend(1).kvstrand_stats()["pages_written"] == 0
        assert e.serve(prompt(1, 5)) == 5  # rank 1 reads rank 0's pages
        assert e.backend(1).kvstrand_stats()["pages_read"] == 5
        assert e.mismatches == 0
        # Asked to back up (SGLang skips it on those ranks, an older commit
        # might not), rank 1 says the pages are stored and writes nothing.
        hashes = mini_sglang.page_hashes(prompt(2, 2), PAGE)
        assert e.backend(1).batch_set_v1(hashes, np.arange(2 * PAGE)) == [True, True]
        assert e.backend(0).batch_exists(hashes) == 0
    finally:
        e.close()


def test_no_call_raises_or_returns_none_while_the_server_is_down_and_it_attaches_when_one_answers(tmp_path):
    socket = str(tmp_path / "later.sock")
    e = mini_sglang.MiniSGLang(socket, request_timeout_s=1.0)
    try:
        b = e.backend()
        hashes = mini_sglang.page_hashes(prompt(1, 2), PAGE)
        idx = np.arange(2 * PAGE)
        assert b.batch_exists(hashes) == 0
        assert b.batch_get_v1(hashes, idx) == [False, False]
        assert b.batch_set_v1(hashes, idx) == [False, False]
        assert e.serve(prompt(1, 2)) == 0
        server = Server(chunk_tokens=PAGE, socket=socket)
        try:
            end = time.monotonic() + 15
            while b.batch_set_v1(hashes, idx) != [True, True]:
                assert time.monotonic() < end, "kvstrand.sglang never attached to the server that came up"
                time.sleep(0.1)
            assert b.batch_exists(hashes) == 2
        finally:
            server.stop()
        # Gone again: misses, and False, not an exception.
        assert b.batch_exists(hashes) == 0
        assert b.batch_set_v1(hashes, idx) == [False, False]
    finally:
        e.close()


def test_pages_that_are_not_whole_pages_are_false_not_a_wrong_copy(page_server):
    e = mini_sglang.MiniSGLang(page_server.socket)
    try:
        b = e.backend()
        hashes = mini_sglang.page_hashes(prompt(1, 2), PAGE)
        assert b.batch_set_v1(hashes, np.arange(3, 3 + 2 * PAGE)) == [False, False]  # not page-aligned
        assert b.batch_get_v1(hashes, np.arange(PAGE)) == [False, False]  # one page's indices for two keys
    finally:
        e.close()


def test_a_hit_no_get_follows_is_released_at_the_lease_bound(page_server):
    e = mini_sglang.MiniSGLang(page_server.socket, lease_bound_s=0.3)
    try:
        e.serve(prompt(1, 3))
        assert e.backend().batch_exists(mini_sglang.page_hashes(prompt(1, 3), PAGE)) == 3
        assert page_server.tier()["leases"] == 1  # held for the get SGLang would send
        end = time.monotonic() + 10
        while page_server.tier()["leases"] != 0:  # SGLang revoked the prefetch: no get comes
            assert time.monotonic() < end, "a revoked prefetch's lease was never released"
            time.sleep(0.05)
        assert e.backend().kvstrand_stats()["leases_expired"] == 1
    finally:
        e.close()


@pytest.mark.skipif(not mini_sglang.HAS_V2, reason="this picture of SGLang has no v2 (hybrid) interface")
def test_the_hybrid_hit_is_the_greatest_end_point_legal_for_every_pool(page_server):
    e = mini_sglang.MiniSGLang(page_server.socket, mamba=True)
    try:
        tokens = prompt(1, 6)
        assert e.serve(tokens, save_mamba_at=[3]) == 0  # KV of 6 pages, a state at page 3 only
        # Not 6 (no state there), not 0: page 3, where the KV and a state both are.
        assert e.serve(tokens, save_mamba_at=[3, 6]) == 3
        assert e.serve(tokens) == 6  # a state at page 6 now too
        assert e.mismatches == 0
    finally:
        e.close()


def test_one_node_tier_serves_an_sglang_and_a_vllm_engine_as_two_tenants_each_kept_to_its_quota():
    from mini_vllm import MiniVllm

    server = Server(tier="4M", slab="2M", chunk_tokens=PAGE,
                    extra=["--tenant-quota", "sgl=2M", "--tenant-quota", "vllm=2M"])
    sgl = mini_sglang.MiniSGLang(server.socket, tenant="sgl")
    vllm = MiniVllm(server.socket, caching=False, chunk_tokens=PAGE, tenant="vllm")
    try:
        prefix = list(range(500, 500 + 4 * PAGE))
        vllm.add("v0", prefix + [1])
        vllm.run()
        # SGLang floods the tier with twice its size; vLLM's prefix is kept (its quota's reserve).
        for p in range(120):
            sgl.serve(prompt(p + 10, 10))
        vllm.add("v1", prefix + [2])
        vllm.run()
        assert vllm.stats["resumed"] == 1 and vllm.stats["mismatches"] == 0
        assert sgl.serve(prompt(129, 10)) == 10  # SGLang's own recent pages resume too
        assert sgl.mismatches == 0
        tenants = {t["tenant"]: t for t in server.tier()["tenants"]}
        assert tenants["sgl"]["evictions"] > 0 and tenants["vllm"]["evictions"] == 0
    finally:
        sgl.close()
        vllm.shutdown()
        server.stop()
