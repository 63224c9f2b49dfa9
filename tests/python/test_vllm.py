"""kvstrand.vllm driven by a miniature of vLLM's engine core (mini_vllm.py:
vLLM's request statuses, per-step block allocation, local prefix cache,
preemption, aborts and load-failure handling, with vLLM's assertions),
against a real kvstrand-server: scheduler and workers are separate
Connectors, the metadata is pickled between them, and every block a request
holds when it finishes (or loads) is checked against the toy model's KV."""

import os
import shutil
import subprocess
import sys
import time
import types
from functools import partial
from types import SimpleNamespace

import prometheus_client
import pytest

import kvstrand
import kvstrand.vllm as kv_vllm
from kvstrand.vllm.config import ConnectorConfig
from conftest import Server
from kvstrand.vllm.events import BlockRemoved, BlockStored, EventLog, SaveEnded
from mini_vllm import BLOCK, HEAD, HEADS, NEWEST, NULL, PICTURE, FakeTensor, MiniVllm, Request, block_hashes, configs

PREFIX = list(range(1000, 1256))  # four 64-token chunks
needs_sim_hooks = pytest.mark.skipif(not kvstrand.sim.available(), reason="needs the sim backend's stream hooks")
HYBRID = [("full", 2, 0), ("sliding", 1, 32)]
# The seed's shape: attention plus single-layer Mamba groups as vLLM's
# --mamba-cache-mode align presents them.
MAMBA = [("full", 2, 0), ("mamba", 1, 0), ("mamba", 1, 0)]
# v0.18 cannot recover a failed load under several KV-cache groups, and
# asserts no external KV for Mamba: kvstrand.vllm refuses both there
# (test_v018_refuses_hybrid_models_at_start), so what serves them runs
# against the newest picture.
newest_only = pytest.mark.skipif(not NEWEST, reason="a hybrid model: refused under vLLM v0.18")
oldest_only = pytest.mark.skipif(NEWEST, reason="what vLLM v0.18 does")
BASE = "vllm.distributed.kv_transfer.kv_connector.v1.base"
BLOCK_ELEMS = BLOCK * HEADS * HEAD


def test_the_interface_is_the_installed_vllms():
    assert kv_vllm.VLLM_AVAILABLE and PICTURE in ("oldest", "newest")
    base = sys.modules[BASE]  # the picture's: the real base, never a stand-in, when vLLM is importable
    assert kv_vllm.KVConnectorBase_V1 is base.KVConnectorBase_V1
    assert issubclass(kv_vllm.KvstrandConnector, base.KVConnectorBase_V1)
    assert issubclass(kv_vllm.KvstrandConnector, base.SupportsHMA)
    assert kv_vllm.SUPPORTED == "vLLM 0.18 to vLLM main at 00f4240"
    for name in ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
                 "request_finished", "request_finished_all_groups", "update_connector_output", "reset_cache",
                 "register_kv_caches", "bind_connector_metadata", "start_load_kv", "wait_for_save", "get_finished",
                 "get_transfer_results", "get_block_ids_with_load_errors", "handle_preemptions",
                 "wait_for_layer_load", "save_kv_layer", "get_kv_connector_stats", "build_kv_connector_stats",
                 "requires_kv_delivery", "has_pending_block_frees"):
        assert name in vars(kv_vllm.KvstrandConnector), name


def run_python(code, picture_dir=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (picture_dir, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_without_vllm_the_local_copy_of_the_newest_interface_stands_in():
    out = run_python("import kvstrand.vllm as v; from kvstrand.vllm import interface as i; "
                     "print(v.VLLM_AVAILABLE, hasattr(i.KVConnectorBase_V1, 'get_transfer_results'), "
                     "hasattr(i.KVConnectorBase_V1, 'has_pending_block_frees'))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "True"]


def test_a_vllm_module_that_does_not_import_is_an_error_naming_it(tmp_path):
    # Before: one try around every import, and a local copy stood in silently.
    picture = tmp_path / "broken"
    shutil.copytree(os.path.join(os.path.dirname(__file__), "vllm_pictures", "newest"), picture)
    (picture / "vllm/distributed/kv_transfer/kv_connector/v1/metrics.py").write_text(
        "raise ImportError('cannot import name PromMetric')\n")
    out = run_python("import kvstrand.vllm", str(picture))
    assert out.returncode != 0
    assert "vllm.distributed.kv_transfer.kv_connector.v1.metrics does not import" in out.stderr
    assert "cannot import name PromMetric" in out.stderr and "vLLM 0.18 to vLLM main at 00f4240" in out.stderr


def test_a_vllm_older_than_the_range_is_named_once(monkeypatch, caplog):
    monkeypatch.setattr(sys.modules["vllm"], "__version__", "0.17.1")
    monkeypatch.setattr(kv_vllm.connector, "_range_checked", False)
    vllm_config, kv_cache_config = configs("/nonexistent.sock", 1, 16, 2, 64)
    with caplog.at_level("WARNING", logger="kvstrand.vllm"):
        for _ in range(2):
            kv_vllm.KvstrandConnector(vllm_config, kv_vllm.KVConnectorRole.WORKER, kv_cache_config, tp_rank=0).shutdown()
    said = [r.getMessage() for r in caplog.records if "older than the oldest verified" in r.getMessage()]
    assert len(said) == 1 and "vLLM 0.17.1" in said[0] and kv_vllm.SUPPORTED in said[0]
    assert kv_vllm.interface.version_outside_range("0.18.0") is None
    assert kv_vllm.interface.version_outside_range("0.29.0.dev0+g00f4240") is None


def test_a_vllm_that_asks_for_a_method_kvstrand_lacks_is_refused_naming_it(monkeypatch):
    monkeypatch.setattr(kv_vllm.KvstrandConnector, "__abstractmethods__", frozenset({"on_new_hook"}))
    vllm_config, kv_cache_config = configs("/nonexistent.sock", 1, 16, 2, 64)
    with pytest.raises(kvstrand.ConfigError, match="on_new_hook") as e:
        kv_vllm.KvstrandConnector(vllm_config, kv_vllm.KVConnectorRole.SCHEDULER, kv_cache_config)
    assert e.value.option == "kv_transfer_config.kv_connector" and kv_vllm.SUPPORTED in str(e.value)


@pytest.mark.parametrize("extra, option", [
    (dict(server_socket=""), "kv_connector_extra_config.server_socket"),
    (dict(chunk_tokens=40), "kv_connector_extra_config.chunk_tokens"),
    (dict(planes_per_layer=3), "kv_connector_extra_config.planes_per_layer"),
    (dict(chunk_size=64), "kv_connector_extra_config.chunk_size"),
    (dict(min_load_tokens="many"), "kv_connector_extra_config.min_load_tokens"),
    (dict(max_load_failures=-1), "kv_connector_extra_config.max_load_failures"),
    (dict(policy="fail"), "kv_transfer_config.kv_load_failure_policy"),
    (dict(groups=[("full", 1, 0), ("mamba", 1, 0)], mamba_cache_mode="all"),
     "kv_cache_config.kv_cache_groups[1].kv_cache_spec"),
    pytest.param(dict(groups=[("sliding", 1, 32), ("mamba", 1, 0)]), "kv_cache_config.kv_cache_groups",
                 marks=newest_only),
    (dict(pipeline_parallel_size=2), "parallel_config.pipeline_parallel_size"),
    (dict(decode_context_parallel_size=2), "parallel_config.decode_context_parallel_size"),
    (dict(prefill_context_parallel_size=4), "parallel_config.prefill_context_parallel_size"),
])
def test_a_configuration_it_cannot_serve_is_refused_at_start_naming_the_option(extra, option):
    extra = dict(extra)
    vllm_config, kv_cache_config = configs("/nonexistent.sock", 1, 16, 2, extra.pop("chunk_tokens", 64), **extra)
    with pytest.raises(kvstrand.ConfigError) as e:
        kv_vllm.KvstrandConnector(vllm_config, kv_vllm.KVConnectorRole.SCHEDULER, kv_cache_config)
    assert e.value.option == option and option in str(e.value)


def test_a_mamba_group_outside_align_mode_is_refused_saying_why():
    vllm_config, kv_cache_config = configs("/nonexistent.sock", 1, 16, 2, 64, groups=[("full", 1, 0), ("mamba", 1, 0)],
                                           mamba_cache_mode="none")
    with pytest.raises(kvstrand.ConfigError, match="--mamba-cache-mode align"):
        kv_vllm.KvstrandConnector(vllm_config, kv_vllm.KVConnectorRole.WORKER, kv_cache_config, tp_rank=0)


def installed_vllm_scheduler(monkeypatch, scheduler):
    """Makes `scheduler` the Scheduler class of an importable vLLM, for the
    start-up checks that read its source."""
    for name in ("vllm", "vllm.v1", "vllm.v1.core", "vllm.v1.core.sched"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    module = types.ModuleType("vllm.v1.core.sched.scheduler")
    module.Scheduler = scheduler
    monkeypatch.setitem(sys.modules, "vllm.v1.core.sched.scheduler", module)


class _MambaSplitAsReleased:
    """The shape of Scheduler._mamba_block_aligned_split through vLLM 0.22."""

    def _mamba_block_aligned_split(self, request, num_new_tokens, num_new_local_computed_tokens=0,
                                   num_external_computed_tokens=0):
        assert num_external_computed_tokens == 0, "External KV connector is not verified yet"
        return num_new_tokens


class _MambaSplitPatched:
    def _mamba_block_aligned_split(self, request, num_new_tokens, num_new_local_computed_tokens=0,
                                   num_external_computed_tokens=0):
        return num_new_tokens


@pytest.mark.parametrize("scheduler, refused", [(_MambaSplitAsReleased, True), (_MambaSplitPatched, False)])
def test_mamba_groups_are_refused_where_vllms_scheduler_asserts_no_external_kv(monkeypatch, scheduler, refused):
    installed_vllm_scheduler(monkeypatch, scheduler)
    vllm_config, kv_cache_config = configs("/nonexistent.sock", 1, 16, 2, 16, groups=MAMBA)
    if refused:
        with pytest.raises(kvstrand.ConfigError) as e:
            ConnectorConfig.from_vllm(vllm_config, kv_cache_config)
        assert e.value.option == "kv_cache_config.kv_cache_groups[1].kv_cache_spec"
        assert "External KV connector is not verified yet" in str(e.value) and "#39702" in str(e.value)
    else:
        cfg = ConnectorConfig.from_vllm(vllm_config, kv_cache_config)
        assert len(cfg.groups) == 1 and [g.index for g in cfg.state_groups] == [1, 2]
        assert cfg.layout(0).checkpoint.image_bytes == 2 * cfg.state_layers[0].page_size_bytes


class _SchedulerOf00024d3:
    """The shape of vLLM's load-failure path at 00024d3, for the source check."""

    def _update_requests_with_invalid_blocks(self, requests, invalid_block_ids, evict_blocks=True):
        for request in requests:
            (req_block_ids,) = self.kv_cache_manager.get_block_ids(request.request_id)
            del req_block_ids


class _SchedulerOfAnotherVersion:
    def _update_requests_with_invalid_blocks(self, requests, invalid_block_ids, evict_blocks=True):
        for request in requests:
            for group_block_ids in self.kv_cache_manager.get_block_ids(request.request_id):
                del group_block_ids


@oldest_only
@pytest.mark.parametrize("scheduler, refused", [(_SchedulerOf00024d3, True), (_SchedulerOfAnotherVersion, False)])
def test_several_groups_are_refused_where_vllms_failure_path_reads_one(monkeypatch, scheduler, refused):
    installed_vllm_scheduler(monkeypatch, scheduler)
    vllm_config, kv_cache_config = configs("/nonexistent.sock", 1, 16, 2, 64, groups=HYBRID)
    if refused:
        with pytest.raises(kvstrand.ConfigError) as e:
            ConnectorConfig.from_vllm(vllm_config, kv_cache_config)
        assert e.value.option == "kv_cache_config.kv_cache_groups" and "--disable-hybrid-kv-cache-manager" in str(e.value)
    else:
        assert len(ConnectorConfig.from_vllm(vllm_config, kv_cache_config).groups) == 2


@oldest_only
@pytest.mark.parametrize("groups, option", [(HYBRID, "kv_cache_config.kv_cache_groups"),
                                            (MAMBA, "kv_cache_config.kv_cache_groups[1].kv_cache_spec")])
def test_v018_refuses_hybrid_models_at_start(groups, option):
    # The picture's own scheduler source: its failure path reads one group,
    # and its Mamba split asserts no external KV.
    vllm_config, kv_cache_config = configs("/nonexistent.sock", 1, 16, 2, 16, groups=groups)
    with pytest.raises(kvstrand.ConfigError) as e:
        ConnectorConfig.from_vllm(vllm_config, kv_cache_config)
    assert e.value.option == option


@newest_only
@pytest.mark.parametrize("groups", [HYBRID, MAMBA, [("mamba", 1, 0), ("full", 2, 0)]])
def test_the_newest_vllm_serves_hybrid_models_it_reports_failures_for_per_request(groups):
    # Its scheduler's block-level path still reads one group (the picture has
    # that source), but failures go per request (failed_recving): served.
    assert "(req_block_ids,) =" in __import__("inspect").getsource(
        sys.modules["vllm.v1.core.sched.scheduler"].Scheduler._update_requests_with_invalid_blocks)
    vllm_config, kv_cache_config = configs("/nonexistent.sock", 1, 16, 2, 16, groups=groups)
    cfg = ConnectorConfig.from_vllm(vllm_config, kv_cache_config)
    assert len(cfg.groups) + len(cfg.state_groups) == len(groups)


def test_revision_quantization_and_the_weights_decide_the_namespace():
    spaces = set()
    for kw in (dict(), dict(revision="abc123"), dict(revision="def456"), dict(quantization="fp8"),
               dict(revision="abc123", quantization="fp8")):
        vllm_config, kv_cache_config = configs("/s.sock", 1, 16, 2, 64, **kw)
        spaces.add(kvstrand.namespace_of(ConnectorConfig.from_vllm(vllm_config, kv_cache_config).layout(0)))
    assert len(spaces) == 5


def test_the_cache_dtype_not_the_models_decides_the_namespace():
    spaces = set()
    for dtype in ("auto", "fp8_e4m3", "fp8_e5m2"):
        vllm_config, kv_cache_config = configs("/s.sock", 1, 16, 2, 64, cache_dtype=dtype)
        spaces.add(kvstrand.namespace_of(ConnectorConfig.from_vllm(vllm_config, kv_cache_config).layout(0)))
    assert len(spaces) == 3


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


def spoil_leases(rank, spoiled, groups=None):
    """A metadata hook truncating `rank`'s lease of every load (of `groups`
    only, if given), noting each request spoiled."""
    def spoil(meta):
        for job in meta.loads:
            for part in job.parts:
                if groups is None or part.group in groups:
                    part.handoff[rank] = part.handoff[rank][:-1]
            spoiled.append(job.req_id)
    return spoil


def test_a_lease_a_worker_cannot_adopt_is_reported_as_load_errors_and_recomputed(server):
    vllm = MiniVllm(server.socket, tp=2, caching=False)
    vllm.add("a", PREFIX + [7])
    vllm.run()
    spoiled = []
    vllm.meta_hook = spoil_leases(1, spoiled)
    vllm.add("b", PREFIX + [8])
    vllm.run()
    assert spoiled and set(spoiled) == {"b"}
    assert vllm.stats["load_errors"] >= 1
    assert vllm.stats["resumed"] == 0 and vllm.stats["mismatches"] == 0  # recomputed, exactly
    assert vllm.all_blocks_free()
    vllm.shutdown()


def test_a_failed_load_is_counted_failed_and_loads_no_tokens(server):
    # vLLM's log and Prometheus read loaded_tokens: a load that failed
    # brought nothing (every attempt here fails on the one rank).
    vllm = MiniVllm(server.socket, caching=False)
    vllm.add("a", PREFIX + [7])
    vllm.run()
    vllm.meta_hook = spoil_leases(0, [])
    vllm.add("b", PREFIX + [8])
    vllm.run()
    stats = vllm.summed_stats()
    assert stats["loads"] >= 1 and stats["loads_failed"] == stats["loads"] and stats["loaded_tokens"] == 0
    assert vllm.stats["resumed"] == 0 and vllm.stats["mismatches"] == 0
    vllm.shutdown()


def test_a_request_whose_loads_keep_failing_is_offered_no_more_hits(server):
    # A load failing from its first block makes vLLM free the blocks and ask
    # again; without a bound that repeats for as long as the tier answers.
    vllm = MiniVllm(server.socket, caching=False, max_load_failures=2)
    vllm.add("a", PREFIX + [7])
    vllm.run()
    spoiled = []
    vllm.meta_hook = spoil_leases(0, spoiled)
    vllm.add("b", PREFIX + [8])
    vllm.run(timeout=20)
    assert spoiled == ["b", "b"] and vllm.stats["load_errors"] == 2
    assert vllm.done == ["a", "b"] and vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    assert vllm.summed_stats()["loads_failed"] == 2
    vllm.shutdown()


def test_a_lease_adopted_elsewhere_first_is_a_load_error_not_a_hang(server):
    vllm = MiniVllm(server.socket, caching=False)
    vllm.add("a", PREFIX + [7])
    vllm.run()
    thief = kvstrand.Connector(server_socket=server.socket)
    thief.register_layout(kvstrand.Registration(vllm.scheduler._scheduler.layouts[0][0]))

    def steal(meta):
        for job in meta.loads:
            thief.adopt_lease(job.parts[0].handoff[0])  # another process takes it first
            time.sleep(0.2)

    vllm.meta_hook = steal
    vllm.add("b", PREFIX + [8])
    vllm.run()
    assert vllm.stats["load_errors"] >= 1 and vllm.stats["mismatches"] == 0
    thief.close()
    vllm.shutdown()


def held_until_the_stream_runs(vllm, stream, req_id):
    """With `stream` held, `req_id`'s blocks stay vLLM's to keep however many
    steps pass; once it runs, every block goes back to the pool once."""
    for _ in range(20):
        vllm.step()
    assert req_id in vllm.held()
    kvstrand.sim.release_stream(stream.native)
    vllm.run()
    assert vllm.all_blocks_free()


@needs_sim_hooks
def test_a_finished_requests_blocks_are_freed_only_after_its_saves(server):
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native)
    kvstrand.sim.hold_stream(stream.native)  # the forward passes have not run on the device
    vllm.add("a", PREFIX + [7], max_tokens=1)
    vllm.run(until=lambda: vllm.done)
    assert vllm.done == ["a"]
    assert "a" in vllm.held()  # request_finished said: wait for get_finished
    held_until_the_stream_runs(vllm, stream, "a")  # its saves cannot have read the blocks yet
    vllm.shutdown()


@needs_sim_hooks
def test_preemption_fences_the_requests_transfers_before_its_blocks_are_reused(server):
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native)
    vllm.add("a", PREFIX + list(range(200)), max_tokens=1)
    kvstrand.sim.set_stream_delay(stream.native, 0.3)  # each save waits 0.3 s for its forward pass
    worker = vllm.workers[0]._worker
    vllm.run(until=lambda: worker.saves_queued.get("a"))  # one save live, the next queued behind it
    assert "a" in worker.saving
    vllm.preempt_next = {"a"}
    t0 = time.monotonic()
    vllm.step()  # the fence runs before this step's forward; the queued save is dropped, never posted
    assert time.monotonic() - t0 >= 0.1
    assert "a" not in worker.saving and "a" not in worker.saves_queued
    kvstrand.sim.set_stream_delay(stream.native, 0)
    vllm.run()
    assert vllm.done == ["a"] and vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    vllm.shutdown()


@needs_sim_hooks
def test_a_request_aborted_while_it_loads_ends_with_every_block_freed_once(server):
    # vLLM keeps an aborted request that waits for remote KV until
    # finished_recving, then frees and deletes it; a connector that also
    # asked to delay (request_finished -> True) would report it as sent
    # afterwards and trip vLLM's assertion on an unknown request.
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native, caching=False)
    vllm.add("a", PREFIX + [7], max_tokens=1)
    vllm.run()
    kvstrand.sim.hold_stream(stream.native)  # the load waits for the engine's stream
    vllm.add("b", PREFIX + [8], max_tokens=1)
    vllm.run(until=lambda: "b" in vllm.workers[0]._worker.loading)
    vllm.abort("b")
    held_until_the_stream_runs(vllm, stream, "b")  # its load would still write the blocks
    vllm.shutdown()


@needs_sim_hooks
def test_a_preempted_request_aborted_while_it_reloads_its_own_chunks_is_freed_once(server):
    # a saved chunks, was preempted, and is re-admitted with a load of what
    # it saved: saves were posted for it, and still request_finished must
    # leave the free to vLLM while the load is in flight.
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native, caching=False)
    vllm.add("a", PREFIX + list(range(100)), max_tokens=1)
    vllm.run(until=lambda: vllm.requests["a"].num_computed_tokens >= 256)
    vllm.step()
    vllm.preempt_next = {"a"}
    vllm.step()  # its saves fenced: stored
    kvstrand.sim.hold_stream(stream.native)
    vllm.run(until=lambda: "a" in vllm.workers[0]._worker.loading)
    vllm.abort("a")
    held_until_the_stream_runs(vllm, stream, "a")
    vllm.shutdown()


def wait_for(condition, timeout=10.0):
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "not reached in time"
        time.sleep(0.01)


def test_a_lookup_answered_after_its_request_ended_gives_its_lease_back(server):
    vllm = MiniVllm(server.socket, tp=2, caching=False)
    vllm.add("a", PREFIX + [1])
    vllm.run()
    scheduler = vllm.scheduler
    r = Request("b", PREFIX + [2], 2)
    assert scheduler.get_num_new_matched_tokens(r, 0) == (None, False)  # a lookup per rank posted
    assert scheduler.request_finished(r, []) == (False, None)  # aborted before any answer
    idle = SimpleNamespace(scheduled_new_reqs=[], num_scheduled_tokens={}, scheduled_cached_reqs=SimpleNamespace(
        req_ids=[], new_block_ids=[], num_computed_tokens=[]))
    side = scheduler._scheduler
    wait_for(lambda: scheduler.build_connector_meta(idle) and not side.by_lookup)  # every answer drained
    wait_for(lambda: server.tier()["leases"] == 0)  # each given back on arrival (a release is posted, not awaited)
    # Asked about again, then finished with its first answers unused.
    r = Request("c", PREFIX + [3], 2)
    wait_for(lambda: scheduler.get_num_new_matched_tokens(r, 0)[0] is not None)
    assert server.tier()["leases"] == 2  # one per rank, held for the load vLLM may decide
    assert scheduler.request_finished(r, []) == (False, None)
    wait_for(lambda: server.tier()["leases"] == 0)
    vllm.shutdown()


def test_requests_aborted_while_looked_up_and_while_saving_free_their_blocks(server):
    vllm = MiniVllm(server.socket, caching=False)
    vllm.add("a", PREFIX + list(range(100)), max_tokens=4)
    vllm.step()
    vllm.step()  # its lookup answered; now computing
    vllm.add("b", PREFIX + [1])
    vllm.step()  # b's lookups posted: not known yet
    vllm.abort("b")
    vllm.abort("a")
    vllm.run()
    assert vllm.all_blocks_free() and vllm.stats["mismatches"] == 0
    vllm.shutdown()


@needs_sim_hooks
def test_a_preemption_vllm_does_not_announce_is_fenced_when_its_blocks_are_given_out(server):
    # preempted_req_ids left empty: the worker learns of it only when the
    # scheduler gives a's old blocks out again (here to a itself, re-admitted
    # and growing through the 13-block pool). Its first save, 0.5 s behind its
    # forward pass, must end before they are written, or the tier would keep
    # another position's KV under a's key.
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native, caching=False, num_blocks=14)
    vllm.announce_preemptions = False
    prompt = PREFIX[:128] + list(range(32))
    vllm.add("a", prompt, max_tokens=1)
    kvstrand.sim.set_stream_delay(stream.native, 0.5)
    worker = vllm.workers[0]._worker
    vllm.run(until=lambda: worker.saving)
    vllm.preempt_next = {"a"}
    vllm.step()
    assert "a" in worker.saving  # nobody told the worker
    vllm.run(until=lambda: vllm.done)
    kvstrand.sim.set_stream_delay(stream.native, 0)
    vllm.run()
    vllm.add("c", prompt, max_tokens=1)  # loads what a stored: at least the chunk its old blocks held
    vllm.run()
    assert vllm.stats["resumed"] == 1 and vllm.stats["loaded_tokens"] >= 64
    assert vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    vllm.shutdown()


@pytest.mark.parametrize("tp", [1, 2])
def test_preemptions_inside_allocation_reuse_blocks_in_the_same_step_and_stay_exact(server, tp):
    vllm = MiniVllm(server.socket, tp=tp, num_blocks=40, budget=96)
    for i in range(4):
        vllm.add(f"r{i}", PREFIX[:128] + list(range(i * 300, i * 300 + 100)), max_tokens=60)
    vllm.run(timeout=60)
    assert vllm.stats["preempted"] >= 1  # blocks ran out: vLLM took some back
    assert len(vllm.done) == 4 and vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
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
def test_the_seeds_shape_resumes_kv_and_mamba_state_byte_exact_from_the_tier(block_server, tp):
    # Steps end on the block grid (64-token budget): 0-64, 64-128, then the
    # prompt's last whole block 128-144 (vLLM forces it to be a step end),
    # then 144-150. Each save carries the state of the chunk its step ended
    # on, so the tier holds 144 tokens with checkpoints at 64, 128 and 144.
    vllm = mamba_engine(block_server, tp=tp)
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


def test_reset_cache_stops_reading_what_was_stored_before(server):
    vllm = MiniVllm(server.socket, caching=False)
    vllm.add("a", PREFIX + [1])
    vllm.run()
    assert vllm.scheduler.reset_cache() is True
    vllm.add("b", PREFIX + [2])
    vllm.run()
    assert vllm.stats["resumed"] == 0  # a's chunks are of the old epoch
    vllm.add("c", PREFIX + [3])
    vllm.run()
    assert vllm.stats["resumed"] == 1 and vllm.stats["mismatches"] == 0  # b's are of the new one
    vllm.shutdown()


def test_a_server_sigkilled_mid_run_costs_only_misses(server):
    # Lookups, saves and loads against a dead server fail; vLLM computes
    # instead, and every block is still exact.
    vllm = MiniVllm(server.socket, tp=2, request_timeout_s=1.0, caching=False)
    vllm.add("a", PREFIX + [7], max_tokens=1)
    vllm.run()
    for i in range(4):
        vllm.add(f"r{i}", PREFIX + list(range(i * 10, i * 10 + 30)), max_tokens=2)
    vllm.step()
    vllm.step()  # lookups answered, leases handed to the workers: their adoptions and loads now fail
    server.kill()
    vllm.run()
    assert len(vllm.done) == 5 and vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    vllm.shutdown()


def test_wrong_side_calls_are_refused(server):
    vllm = MiniVllm(server.socket)
    with pytest.raises(RuntimeError, match="not a scheduler-side call"):
        vllm.scheduler.register_kv_caches({})
    with pytest.raises(RuntimeError, match="not a worker-side call"):
        vllm.workers[0].build_connector_meta(SimpleNamespace())
    vllm.shutdown()


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
@needs_sim_hooks
def test_vllm_waits_for_blocks_a_finished_requests_saves_hold_instead_of_preempting(server):
    # a finished; its saves wait for a held stream, so vLLM keeps its 9
    # blocks. b grows past what is left: before, vLLM had to preempt b (the
    # connector did not answer has_pending_block_frees); now it waits a step
    # at a time until a's saves end and its blocks come back.
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native, num_blocks=24, caching=False)
    kvstrand.sim.hold_stream(stream.native)
    vllm.add("a", PREFIX[:128] + [1], max_tokens=1)
    vllm.run(until=lambda: vllm.done)
    assert "a" in vllm.held() and vllm.scheduler.has_pending_block_frees()
    vllm.add("b", list(range(3000, 3208)), max_tokens=40)
    vllm.run(until=lambda: vllm.waited_for_frees >= 3)
    assert vllm.stats["preempted"] == 0
    kvstrand.sim.release_stream(stream.native)
    vllm.run()
    assert vllm.done == ["a", "b"] and vllm.stats["preempted"] == 0 and not vllm.scheduler.has_pending_block_frees()
    assert vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
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


def test_stats_this_vllm_cannot_take_are_turned_off_once_and_the_engine_runs(server, monkeypatch, caplog):
    def broken(self):
        raise TypeError("KVConnectorStats.__init__() missing 1 required positional argument: 'kind'")
    monkeypatch.setattr(kv_vllm.stats.KvstrandStats, "take", broken)
    vllm = MiniVllm(server.socket, caching=False)
    with caplog.at_level("WARNING", logger="kvstrand.vllm"):
        vllm.add("a", PREFIX + [1])
        vllm.run()
        vllm.add("b", PREFIX + [2])
        vllm.run()
    assert vllm.done == ["a", "b"] and vllm.stats["resumed"] == 1 and vllm.connector_stats == []
    said = [r for r in caplog.records if "connector stats off" in r.getMessage()]
    assert len(said) == 2  # once per connector (the scheduler's and the worker's), not per step
    vllm.shutdown()


def test_kv_events_this_vllm_cannot_make_are_turned_off_and_the_engine_runs(tmp_path):
    picture = tmp_path / "no-events"
    shutil.copytree(os.path.join(os.path.dirname(__file__), "vllm_pictures", PICTURE), picture)
    (picture / "vllm/distributed/kv_events.py").unlink()
    here = os.path.dirname(os.path.abspath(__file__))
    out = run_python(
        "import logging, sys; logging.basicConfig(level=logging.WARNING); sys.path.insert(1, %r)\n"
        "import kvstrand.vllm as v\nfrom mini_vllm import configs\n"
        "vc, kc = configs('/nonexistent.sock', 1, 16, 2, 64, kv_events=True)\n"
        "print('events', v.config.ConnectorConfig.from_vllm(vc, kc).kv_events)" % here, str(picture))
    assert out.returncode == 0, out.stderr
    assert "events False" in out.stdout and "KV events off" in out.stderr and "kv_events" in out.stderr


def test_vllm_starts_before_its_server_serves_without_it_and_uses_it_once_it_is_up(tmp_path):
    # Before: the scheduler's and workers' Connectors raised TransferRefused
    # at registration, and vLLM did not start. Now every request is computed
    # until the server answers, then saved and resumed from it.
    path = str(tmp_path / "later.sock")
    vllm = MiniVllm(path, caching=False, request_timeout_s=1.0)
    vllm.add("a", PREFIX + [1])
    vllm.run()
    assert vllm.done == ["a"] and vllm.stats["resumed"] == 0
    server = Server(socket=path)
    try:
        for i in range(40):
            vllm.add(f"r{i}", PREFIX + [i + 10])
            vllm.run()
            if vllm.stats["resumed"]:
                break
            time.sleep(0.1)
        assert vllm.stats["resumed"] >= 1 and vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    finally:
        vllm.shutdown()
        server.stop()


def test_the_tenant_salt_option_reaches_the_namespace():
    spaces = set()
    for salt in ("", "tenant-a", "tenant-b"):
        vllm_config, kv_cache_config = configs("/s.sock", 1, 16, 2, 64, tenant_salt=salt)
        cfg = ConnectorConfig.from_vllm(vllm_config, kv_cache_config)
        assert cfg.layout(0).tenant_salt == salt
        spaces.add(kvstrand.namespace_of(cfg.layout(0)))
    assert len(spaces) == 3


def test_tp_ranks_checkpoints_are_combined_as_the_points_every_rank_holds():
    # A hit resumes at a chunk end only where every rank holds that
    # checkpoint: the intersection, never the union (a rank without the
    # state there would resume from garbage).
    from kvstrand.vllm.scheduler import SchedulerSide

    def answer(tokens, points):
        return SimpleNamespace(lease=1, hit=SimpleNamespace(tokens=tokens, checkpoints=points))

    r = SimpleNamespace(answers={(0, 0): answer(256, [64, 128, 192, 256]), (1, 0): answer(192, [64, 192])})
    (hit,) = SchedulerSide._group_hits(SimpleNamespace(ngroups=1), r)
    assert hit.tokens == 192 and list(hit.checkpoints) == [64, 192]
