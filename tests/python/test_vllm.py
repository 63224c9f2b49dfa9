"""kvstrand.vllm and the vLLM it runs in: the interface is the installed
vLLM's (or the newest's local copy without one), versions outside the range
are named, a configuration it cannot serve is refused at start naming the
option, what decides the namespace, and optional features (stats, KV events,
the server) that this vLLM or this moment cannot give are turned off, never
stopping the engine. The miniature of vLLM is mini_vllm.py."""

import os
import shutil
import subprocess
import sys
import time
import types
from types import SimpleNamespace

import pytest

import kvstrand
import kvstrand.vllm as kv_vllm
from kvstrand.vllm.config import ConnectorConfig
from conftest import Server
from mini_vllm import PICTURE, MiniVllm, configs
from vllm_cases import BASE, HYBRID, MAMBA, PREFIX, newest_only, oldest_only


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


@pytest.mark.parametrize("version, says", [
    ("0.33.0", "newer than the newest verified"),
    ("1.0.0", "newer than the newest verified"),  # (major, minor): not "older than 0.18"
    ("0.17.1", "older than the oldest verified"),
    ("0.24.2", "inside the verified range"),
])
def test_the_installed_vllm_and_the_verified_range_are_said_in_one_line(monkeypatch, caplog, version, says):
    # A vLLM newer than the newest verified started without a word.
    monkeypatch.setattr(sys.modules["vllm"], "__version__", version)
    monkeypatch.setattr(kv_vllm.connector, "_range_checked", False)
    vllm_config, kv_cache_config = configs("/nonexistent.sock", 1, 16, 2, 64)
    with caplog.at_level("INFO", logger="kvstrand.vllm"):
        kv_vllm.KvstrandConnector(vllm_config, kv_vllm.KVConnectorRole.WORKER, kv_cache_config, tp_rank=0).shutdown()
    said = [r for r in caplog.records if f"vLLM {version}" in r.getMessage()]
    assert len(said) == 1 and says in said[0].getMessage() and kv_vllm.SUPPORTED in said[0].getMessage()
    assert (said[0].levelname == "INFO") == (says == "inside the verified range")


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
    (dict(policy="retry"), "kv_transfer_config.kv_load_failure_policy"),
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


@pytest.mark.parametrize("option, values", [("tenant_salt", ("", "tenant-a", "tenant-b")),
                                            ("weight_version", ("", "step-1000", "step-1001")),
                                            ("tenant", ("", "team-a", "team-b"))])
def test_the_namespace_options_reach_the_namespace(option, values):
    spaces = set()
    for value in values:
        vllm_config, kv_cache_config = configs("/s.sock", 1, 16, 2, 64, **{option: value})
        cfg = ConnectorConfig.from_vllm(vllm_config, kv_cache_config)
        assert getattr(cfg.layout(0), option) == value
        spaces.add(kvstrand.namespace_of(cfg.layout(0)))
    assert len(spaces) == len(values)
    # Unsaid, each is empty: the namespace of a layout without it.
    vllm_config, kv_cache_config = configs("/s.sock", 1, 16, 2, 64)
    assert getattr(ConnectorConfig.from_vllm(vllm_config, kv_cache_config).layout(0), option) == ""


def test_a_tenant_name_a_metric_label_cannot_carry_is_refused_at_start_up():
    vllm_config, kv_cache_config = configs("/s.sock", 1, 16, 2, 64, tenant="team a")
    with pytest.raises(kvstrand.ConfigError, match="tenant"):
        ConnectorConfig.from_vllm(vllm_config, kv_cache_config)


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


def test_groups_vllm_marks_untransferable_are_skipped_and_an_unknown_attention_spec_is_refused(caplog):
    # An attention spec kvstrand did not know was taken as full attention,
    # and groups vLLM marks non-transferable (enable_kv_transfer, its sparse
    # attention's indexer) were saved and loaded as ordinary KV.
    from types import SimpleNamespace
    from mini_vllm_model import FullAttentionSpec

    class SparseIndexerSpec(FullAttentionSpec):
        pass

    vllm_config, kv_cache_config = configs("/nonexistent.sock", 1, 16, 2, 64)
    first = kv_cache_config.kv_cache_groups[0]
    indexer = SimpleNamespace(layer_names=["model.layers.9.indexer"], enable_kv_transfer=False,
                              kv_cache_spec=SparseIndexerSpec(block_size=first.kv_cache_spec.block_size,
                                                              page_size_bytes=64, sliding_window=None))
    kv_cache_config.kv_cache_groups.append(indexer)
    with caplog.at_level("INFO", logger="kvstrand.vllm"):
        cfg = kv_vllm.config.ConnectorConfig.from_vllm(vllm_config, kv_cache_config)
    assert [g.index for g in cfg.groups] == [0]  # the untransferable group is not served
    assert any("group 1 (SparseIndexerSpec) is not transferable" in r.getMessage() for r in caplog.records)
    indexer.enable_kv_transfer = True  # said transferable: a spec kvstrand has not read is refused, named
    with pytest.raises(kvstrand.ConfigError) as e:
        kv_vllm.config.ConnectorConfig.from_vllm(vllm_config, kv_cache_config)
    assert e.value.option == "kv_cache_config.kv_cache_groups[1].kv_cache_spec"
    assert "group 1's SparseIndexerSpec" in str(e.value)


def test_load_path_reaches_the_connector_and_an_unknown_word_is_refused_by_name():
    assert ConnectorConfig.from_vllm(*configs("/tmp/x.sock", 1, 16, 2, 64)).connector_options().load_path == "rule"
    cfg = ConnectorConfig.from_vllm(*configs("/tmp/x.sock", 1, 16, 2, 64, load_path="dma-batch"))
    assert cfg.connector_options().load_path == "dma-batch"
    with pytest.raises(kvstrand.ConfigError) as e:
        ConnectorConfig.from_vllm(*configs("/tmp/x.sock", 1, 16, 2, 64, load_path="fastest"))
    assert e.value.option.endswith("load_path")


def test_server_uid_names_another_user_whose_server_is_trusted():
    # The Connector speaks only to a server of its own user or root unless
    # server_uid names another; vLLM's extra config reaches it.
    assert ConnectorConfig.from_vllm(*configs("/tmp/x.sock", 1, 16, 2, 64)).connector_options().server_uid == -1
    cfg = ConnectorConfig.from_vllm(*configs("/tmp/x.sock", 1, 16, 2, 64, server_uid=4242))
    assert cfg.connector_options().server_uid == 4242
    with pytest.raises(kvstrand.ConfigError):
        ConnectorConfig.from_vllm(*configs("/tmp/x.sock", 1, 16, 2, 64, server_uid="root"))
