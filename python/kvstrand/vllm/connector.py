"""KvstrandConnector: vLLM's KV connector V1 over kvstrand's node tier.

Configure vLLM with
    --kv-transfer-config '{"kv_connector": "KvstrandConnector",
                           "kv_connector_module_path": "kvstrand.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"server_socket": "/tmp/kvstrand.sock"}}'
and run kvstrand-server on that socket (--chunk-tokens equal to
chunk_tokens). Options: kvstrand/vllm/config.py.

vLLM builds one connector in the scheduler process (role SCHEDULER) and one
in each worker (role WORKER); this class hands each call to that side. Loads
are asynchronous (between scheduler steps); saves are whole chunks of the
prompt, posted after the step's forward pass and never waited for; layer-wise
calls are no-ops.
"""

from .config import ConnectorConfig
from .interface import KVConnectorBase_V1, KVConnectorRole
from .metadata import KvstrandConnectorMetadata
from .scheduler import SchedulerSide
from .worker import WorkerSide


def _tp_rank():
    try:  # pragma: no cover - vLLM is not installable here
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank  # type: ignore
    except ImportError:
        return 0
    return get_tensor_model_parallel_rank()


class KvstrandConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None, *, tp_rank=None, stream_provider=None):
        """`tp_rank` and `stream_provider` (the current stream's handle) are
        for drivers other than vLLM, which passes neither: then vLLM's TP rank
        and torch's current stream are used."""
        super().__init__(vllm_config, role, kv_cache_config)
        cfg = ConnectorConfig.from_vllm(vllm_config, kv_cache_config)
        self._scheduler = self._worker = None
        if role == KVConnectorRole.SCHEDULER:
            self._scheduler = SchedulerSide(cfg)
        else:
            self._worker = WorkerSide(cfg, _tp_rank() if tp_rank is None else tp_rank, stream_provider)

    def _side(self, side, name):
        if side is None:
            raise RuntimeError(f"KvstrandConnector.{name} is not a {self.role.name.lower()}-side call")
        return side

    # ---- worker side ----
    def register_kv_caches(self, kv_caches):
        self._side(self._worker, "register_kv_caches").register_kv_caches(kv_caches)

    def handle_preemptions(self, kv_connector_metadata):
        """Called before the step's forward pass: the transfers of requests
        whose blocks vLLM took back end first. Accepts the step's metadata
        (vLLM 0.18) or a set of request ids (earlier versions)."""
        ids = getattr(kv_connector_metadata, "preempted", kv_connector_metadata)
        self._side(self._worker, "handle_preemptions").handle_preemptions(set(ids or ()))

    def start_load_kv(self, forward_context, **kwargs):
        self._side(self._worker, "start_load_kv").start_load(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name):
        return  # loads complete before vLLM schedules the request (get_finished)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return  # whole chunks of every layer are saved in wait_for_save

    def wait_for_save(self):
        """Posts this step's saves, ordered after the forward pass on the
        device; returns at once. The blocks stay vLLM's to keep until
        get_finished reports the request (request_finished returned True)."""
        self._side(self._worker, "wait_for_save").save(self._get_connector_metadata())

    def get_finished(self, finished_req_ids):
        return self._side(self._worker, "get_finished").get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self):
        return self._side(self._worker, "get_block_ids_with_load_errors").get_block_ids_with_load_errors()

    # ---- scheduler side ----
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self._side(self._scheduler, "get_num_new_matched_tokens").get_num_new_matched_tokens(
            request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._side(self._scheduler, "update_state_after_alloc").update_state_after_alloc(
            request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output) -> KvstrandConnectorMetadata:
        return self._side(self._scheduler, "build_connector_meta").build_connector_meta(scheduler_output)

    def request_finished(self, request, block_ids):
        return self._side(self._scheduler, "request_finished").request_finished(request, block_ids)

    def shutdown(self):
        (self._scheduler or self._worker).shutdown()
