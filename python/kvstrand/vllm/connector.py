"""KvstrandConnector: vLLM's KV connector V1 over kvstrand's node tier.

Configure vLLM with
    --kv-transfer-config '{"kv_connector": "KvstrandConnector",
                           "kv_connector_module_path": "kvstrand.vllm",
                           "kv_role": "kv_both",
                           "kv_load_failure_policy": "recompute",
                           "kv_connector_extra_config": {"server_socket": "/tmp/kvstrand.sock"}}'
and run kvstrand-server on that socket (--chunk-tokens equal to
chunk_tokens). Options: kvstrand/vllm/config.py.

vLLM builds one connector in the scheduler process (role SCHEDULER) and one
in each worker (role WORKER); this class hands each call to that side. Loads
are asynchronous (between scheduler steps); saves are whole chunks of the
prompt, posted after the step's forward pass and never waited for; layer-wise
calls are no-ops. It serves vLLM's hybrid allocator (SupportsHMA): one
kvstrand registration per KV-cache group.
"""

import logging

import kvstrand

from . import interface
from .config import ConnectorConfig
from .interface import KVConnectorBase_V1, KVConnectorRole, SupportsHMA
from .metadata import KvstrandConnectorMetadata
from .scheduler import SchedulerSide
from .stats import KvstrandStats, build_prom_metrics
from .worker import WorkerSide

log = logging.getLogger("kvstrand.vllm")
_range_checked = False


def check_vllm_range():
    """Once per process, one line: the installed vLLM, the verified range,
    and whether it is inside (a warning when not). Nothing is refused for
    it: what cannot work is refused where it is found (the interface below,
    the configuration)."""
    global _range_checked
    if _range_checked or not interface.VLLM_AVAILABLE:
        return
    _range_checked = True
    version = interface.vllm_version()
    why = interface.version_outside_range(version)
    if why:
        log.warning("kvstrand.vllm: %s; kvstrand.vllm is verified with %s (not refused: what cannot work is "
                    "refused where it is found)", why, interface.SUPPORTED)
    else:
        log.info("kvstrand.vllm: vLLM %s, inside the verified range (%s)", version, interface.SUPPORTED)


def _tp_rank():
    try:  # pragma: no cover - vLLM is not installable here
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank  # type: ignore
    except ImportError:
        return 0
    return get_tensor_model_parallel_rank()


class KvstrandConnector(KVConnectorBase_V1, SupportsHMA):
    def __new__(cls, *args, **kwargs):
        # A vLLM whose base declares a method kvstrand does not implement has
        # an interface past the newest verified: say which, not Python's
        # "Can't instantiate abstract class".
        missing = sorted(getattr(cls, "__abstractmethods__", ()))
        if missing:
            e = kvstrand.ConfigError(
                f"invalid option 'kv_transfer_config.kv_connector': this vLLM ({interface.vllm_version()}) asks KV "
                f"connectors for {', '.join(missing)}, which kvstrand.vllm does not implement; it is verified with "
                f"{interface.SUPPORTED}")
            e.option = "kv_transfer_config.kv_connector"
            raise e
        return super().__new__(cls)

    def __init__(self, vllm_config, role, kv_cache_config=None, *, tp_rank=None, stream_provider=None):
        """`tp_rank` and `stream_provider` (the current stream's handle) are
        for drivers other than vLLM, which passes neither: then vLLM's TP rank
        and torch's current stream are used."""
        super().__init__(vllm_config, role, kv_cache_config)
        check_vllm_range()
        cfg = ConnectorConfig.from_vllm(vllm_config, kv_cache_config)
        self._stats = KvstrandStats()
        self._stats_off = False
        self._scheduler = self._worker = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(cfg, self._stats)
        else:
            self._worker = WorkerSide(cfg, _tp_rank() if tp_rank is None else tp_rank, stream_provider, self._stats)

    def _side(self, side, name):
        if side is None:
            raise RuntimeError(f"KvstrandConnector.{name} is not a {self.role.name.lower()}-side call")
        return side

    @property
    def requires_kv_delivery(self):
        """False: a best-effort cache. A save dropped by a preemption is a
        later miss; vLLM need not recompute a request to deliver it."""
        return False

    # ---- worker side ----
    def register_kv_caches(self, kv_caches):
        self._side(self._worker, "register_kv_caches").register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata):
        """The first call of every step, before the forward pass: transfers
        that would touch blocks vLLM took back or gave out end here."""
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and isinstance(connector_metadata, KvstrandConnectorMetadata):
            self._worker.before_forward(connector_metadata)

    def handle_preemptions(self, kv_connector_metadata):
        """Before the step's forward pass. Accepts the step's metadata
        (vLLM 0.18: the fences ran in bind_connector_metadata already) or a
        set of request ids (earlier versions)."""
        worker = self._side(self._worker, "handle_preemptions")
        if isinstance(kv_connector_metadata, KvstrandConnectorMetadata):
            worker.before_forward(kv_connector_metadata)
        else:
            worker.handle_preemptions(set(kv_connector_metadata or ()))

    def start_load_kv(self, forward_context, **kwargs):
        """Before or after the forward pass is launched (vLLM moved it after):
        the loads write blocks of requests not in this step's batch."""
        self._side(self._worker, "start_load_kv").start_load(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name):
        return  # loads complete before vLLM schedules the request (get_finished)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return  # whole chunks of every layer are saved in wait_for_save

    def wait_for_save(self):
        """Posts this step's saves, ordered after the forward pass on the
        device (and, when vLLM defers this call past a draft model's forward,
        after that too); returns at once. The blocks stay vLLM's to keep until
        get_finished reports the request (request_finished returned True)."""
        self._side(self._worker, "wait_for_save").save(self._get_connector_metadata())

    def get_finished(self, finished_req_ids):
        """v0.18's report of ended transfers (a failed load: its blocks in
        get_block_ids_with_load_errors)."""
        return self._side(self._worker, "get_finished").get_finished(finished_req_ids)

    def get_transfer_results(self, finished_req_ids):
        """A newer vLLM's report of ended transfers: a failed load's request
        in failed_recving (and finished_recving), never its block ids, which
        vLLM cannot map back under several KV-cache groups."""
        return self._side(self._worker, "get_transfer_results").get_transfer_results(finished_req_ids)

    def get_block_ids_with_load_errors(self):
        return self._side(self._worker, "get_block_ids_with_load_errors").get_block_ids_with_load_errors()

    def get_kv_connector_kv_cache_events(self):
        """Which saves this rank committed or dropped since the last step
        (the scheduler announces a save once every writing rank committed it)."""
        return self._side(self._worker, "get_kv_connector_kv_cache_events").kv_cache_events()

    # ---- both sides ----
    def get_kv_connector_stats(self):
        """This interval's counters; None when nothing happened, or when this
        vLLM's stats class cannot be built (stats off, said once: telemetry
        never stops the engine)."""
        if self._stats_off:
            return None
        try:
            return self._stats.take()
        except Exception as e:  # noqa: BLE001
            self._stats_off = True
            log.warning("kvstrand.vllm: connector stats off: this vLLM's KVConnectorStats is not one kvstrand knows "
                        "(%s: %s); serving goes on without them", type(e).__name__, e)
            return None

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return KvstrandStats(dict(data)) if data is not None else KvstrandStats()

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return build_prom_metrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # ---- scheduler side ----
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self._side(self._scheduler, "get_num_new_matched_tokens").get_num_new_matched_tokens(
            request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._side(self._scheduler, "update_state_after_alloc").update_state_after_alloc(
            request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KvstrandConnectorMetadata:
        return self._side(self._scheduler, "build_connector_meta").build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output):
        self._side(self._scheduler, "update_connector_output").update_connector_output(connector_output)

    def request_finished(self, request, block_ids):
        return self._side(self._scheduler, "request_finished").request_finished(request, block_ids)

    def request_finished_all_groups(self, request, block_ids):
        return self._side(self._scheduler, "request_finished_all_groups").request_finished(request, block_ids)

    def has_pending_block_frees(self):
        """True while finished requests' blocks wait only for their saves:
        vLLM then waits for them instead of preempting a running request."""
        return self._side(self._scheduler, "has_pending_block_frees").has_pending_block_frees()

    def take_events(self):
        """BlockStored / BlockRemoved for the tier (medium "CPU"), see events.py."""
        return self._side(self._scheduler, "take_events").take_events()

    def reset_cache(self):
        return self._side(self._scheduler, "reset_cache").reset_cache()

    def shutdown(self):
        (self._scheduler or self._worker).shutdown()
