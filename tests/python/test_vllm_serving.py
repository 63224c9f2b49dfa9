"""kvstrand.vllm serving a miniature of vLLM's engine core (mini_vllm.py)
against a real kvstrand-server: scheduler and workers are separate
Connectors, the metadata is pickled between them, and every block a request
holds when it finishes (or loads) is checked against the toy model's KV:
shared prefixes on every rank, stats, speculative decoding's tail, local
prefix-cache hits, the content keys (images, adapters, salts), embeddings,
the null block."""

import sys
import time
import types
from functools import partial

import prometheus_client
import pytest

import kvstrand
import kvstrand.vllm as kv_vllm
from mini_vllm import NEWEST, NULL, MiniVllm, Request, configs
from vllm_cases import PREFIX, newest_only


def test_a_best_effort_cache_needs_no_kv_delivery(server):
    vllm = MiniVllm(server.socket)
    assert vllm.scheduler.requires_kv_delivery is False and vllm.workers[0].requires_kv_delivery is False
    vllm.shutdown()


def test_saves_wait_for_the_default_stream_whose_handle_is_0(server):
    # torch's default stream has the handle 0; a save that took 0 for "no
    # stream" copied blocks before the forward pass wrote them (seen on the
    # H200 with torch tensors: test_vllm_torch.py).
    vllm = MiniVllm(server.socket, stream_provider=lambda: 0)
    assert repr(vllm.workers[0]._worker._producer()) == "Producer.after_stream(0)"
    vllm.shutdown()


def test_the_scheduler_says_not_known_yet_while_its_lookup_is_pending(server):
    vllm = MiniVllm(server.socket)
    req = vllm.scheduler
    r = Request("a", PREFIX + [1, 2, 3], 2)
    assert req.get_num_new_matched_tokens(r, 0) == (None, False)  # posted, never waited for
    end = time.monotonic() + 10
    while (answer := req.get_num_new_matched_tokens(r, 0))[0] is None:
        assert time.monotonic() < end
        time.sleep(0.002)
    assert answer == (0, False)  # nothing stored yet
    assert req.get_num_new_matched_tokens(r, 0) == (0, False)  # asked again: the same answer
    assert req.request_finished(r, []) == (False, None)
    vllm.shutdown()


@pytest.mark.parametrize("tp, order, planes", [(1, "new", 2), (2, "new", 2), (1, "old", 2), (2, "old", 2),
                                               (2, "new", 1)])
def test_a_shared_prefix_resumes_from_the_tier_on_every_rank_byte_for_byte(server, tp, order, planes):
    vllm = MiniVllm(server.socket, tp=tp, order=order, caching=False, planes=planes)
    vllm.add("a", PREFIX + list(range(40)))
    vllm.run()
    assert vllm.stats["resumed"] == 0 and vllm.stats["mismatches"] == 0
    vllm.add("b", PREFIX + list(range(500, 530)))  # the same four chunks, another tail
    vllm.run()
    assert vllm.stats["not_known_yet"] >= 2  # each new request waited for its lookups
    assert vllm.stats["resumed"] == 1 and vllm.stats["loaded_tokens"] == 256
    assert vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    stats = vllm.summed_stats()
    assert stats["hit_tokens"] == 256 and stats["loads"] == tp and stats["loaded_tokens"] == 256 * tp
    assert stats["saves"] >= 4 * tp and stats["saves_failed"] == 0
    vllm.shutdown()
    # A new vLLM (new scheduler and workers) on the same node resumes from it too.
    again = MiniVllm(server.socket, tp=tp, order=order, planes=planes)
    again.add("c", PREFIX + list(range(40)))
    again.run()
    assert again.stats["resumed"] == 1 and again.stats["loaded_tokens"] == 256
    assert again.stats["mismatches"] == 0
    again.shutdown()


def test_stats_reach_vllms_log_and_prometheus(server):
    vllm = MiniVllm(server.socket, tp=2, caching=False)
    vllm.add("a", PREFIX + [1])
    vllm.run()
    vllm.add("b", PREFIX + [2])
    vllm.run()
    summed = vllm.summed_stats()
    assert summed["hit_tokens"] == 256 and summed["lookup_tokens"] == 2 * 257 and summed["hit_rate"] == 0.4981
    assert summed["loads"] == 2 and summed["saves"] == 2 * 4 and summed["loads_failed"] == 0
    again = kv_vllm.KvstrandConnector.build_kv_connector_stats(dict(summed))
    assert again.reduce()["hit_tokens"] == 256  # rebuilt from the dict vLLM ships to its logger
    # What vLLM's PrometheusStatLogger does at start-up with stats on (its
    # default), through the picture's own metrics module; before, the newest
    # vLLM's base had no make_per_engine and the API server exited here.
    registry = prometheus_client.CollectorRegistry()
    types = {cls: partial(cls, registry=registry) for cls in (prometheus_client.Gauge, prometheus_client.Counter,
                                                              prometheus_client.Histogram)}
    metrics = sys.modules["vllm.distributed.kv_transfer.kv_connector.v1.metrics"]
    prom = (metrics.KVConnectorProm if NEWEST else metrics.KVConnectorPrometheus)(
        kv_vllm.KvstrandConnector, vllm.vllm_config, ["model_name", "engine"], {0: ["toy", "0"], 1: ["toy", "1"]},
        metric_types=types)
    prom.observe(summed, engine_idx=1)
    prom.observe(summed, engine_idx=1)
    assert registry.get_sample_value("vllm:kvstrand_hit_tokens_total", {"model_name": "toy", "engine": "1"}) == 512
    assert registry.get_sample_value("vllm:kvstrand_hit_tokens_total", {"model_name": "toy", "engine": "0"}) == 0
    assert registry.get_sample_value("vllm:kvstrand_saves_total", {"model_name": "toy", "engine": "1"}) == 16
    vllm.shutdown()


def test_a_metrics_api_kvstrand_does_not_know_turns_its_metrics_off_not_vllm(caplog):
    vllm_config, _ = configs("/nonexistent.sock", 1, 16, 2, 64)
    with caplog.at_level("WARNING", logger="kvstrand.vllm"):
        prom = kv_vllm.KvstrandConnector.build_prom_metrics(vllm_config, {}, ["engine"], {0: ["0"]})
    prom.observe({"hit_tokens": 5}, engine_idx=0)  # nothing to record, nothing raised
    assert any("Prometheus metrics off" in r.getMessage() for r in caplog.records)


def test_a_whole_prompt_hit_still_leaves_a_token_to_compute(server):
    vllm = MiniVllm(server.socket, caching=False)
    vllm.add("a", PREFIX)
    vllm.run()
    vllm.add("b", PREFIX)
    vllm.run()
    assert vllm.stats["loaded_tokens"] == 192  # the last chunk is computed: its last token must be
    assert vllm.stats["mismatches"] == 0
    vllm.shutdown()


def test_speculative_decoding_keeps_a_tail_of_two_and_defers_the_save(server):
    vllm = MiniVllm(server.socket, caching=False, spec_tokens=2)
    vllm.add("a", PREFIX + [5])  # 257 tokens: a tail of 1 would allow all four chunks
    vllm.run()
    vllm.add("b", PREFIX + [5])
    vllm.run()
    assert vllm.stats["loaded_tokens"] == 192 and vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    vllm.shutdown()


def test_a_local_prefix_cache_hit_is_followed_by_a_tier_load_mid_chunk(server):
    vllm = MiniVllm(server.socket)
    vllm.add("a", PREFIX + list(range(30)))  # 18 blocks, freed tail first
    vllm.run()
    vllm.add("filler", list(range(5000, 5798)))  # 50 blocks: takes a's last five
    vllm.run()
    vllm.add("b", PREFIX + list(range(600, 630)))
    vllm.run()
    # 13 blocks (208 tokens) from vLLM's own cache, the rest of the fourth chunk from the tier.
    assert vllm.stats["resumed"] == 1 and vllm.stats["loaded_tokens"] == 48
    assert vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    vllm.shutdown()


def run_pair(server, first, second, **kw):
    """Runs `first` then `second` ((prompt, keys) each) and returns the miniature."""
    vllm = MiniVllm(server.socket, caching=False, **kw)
    vllm.add("first", first[0], **first[1])
    vllm.run()
    vllm.add("second", second[0], **second[1])
    vllm.run()
    return vllm


IMAGE = list(range(1000, 1064)) + [9] * 128 + list(range(1192, 1256))  # an image's 128 placeholder tokens


@pytest.mark.parametrize("first, second, shared", [
    (dict(mm=[(64, 128, "image-A")]), dict(mm=[(64, 128, "image-B")]), 64),  # only the chunk before the image
    (dict(mm=[(64, 128, "image-A")]), dict(mm=[(64, 128, "image-A")]), 256),
    (dict(lora="adapter-1"), dict(lora="adapter-2"), 0),
    (dict(lora="adapter-1"), dict(lora="adapter-1"), 256),
    (dict(salt="tenant-1"), dict(salt="tenant-2"), 0),
    (dict(salt="tenant-1"), dict(), 0),
    (dict(), dict(), 256),
])
def test_images_adapters_and_salts_never_share_a_chunk_they_do_not_have_in_common(server, first, second, shared):
    vllm = run_pair(server, (IMAGE + [1, 2], first), (IMAGE + [3, 4], second))
    assert vllm.stats["loaded_tokens"] == shared and vllm.stats["mismatches"] == 0
    vllm.shutdown()


def test_a_prompt_of_embeddings_is_neither_looked_up_nor_stored(server):
    vllm = MiniVllm(server.socket)
    r = Request("e", PREFIX, 2)
    r.prompt_embeds = object()
    assert vllm.scheduler.get_num_new_matched_tokens(r, 0) == (0, False)
    vllm.shutdown()


@newest_only
def test_the_null_block_is_never_saved_or_loaded_into(server):
    # After reset_cache the tier holds nothing of b's prompt but vLLM's own
    # cache does: b starts from a local hit whose sliding-window blocks
    # before the window are the null block, and saves its chunks from 0.
    named = []

    def record(meta):
        for job in meta.saves + meta.loads:
            named.extend(job.block_ids)

    vllm = MiniVllm(server.socket, groups=[("full", 1, 0), ("sliding", 1, 16)], hybrid_invalid_blocks=True)
    vllm.meta_hook = record
    vllm.add("a", PREFIX + [1])
    vllm.run()
    vllm.scheduler.reset_cache()
    vllm.add("b", PREFIX + [2])
    vllm.run()
    assert vllm.requests.get("b") is None and vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    assert named and NULL not in named
    vllm.shutdown()
