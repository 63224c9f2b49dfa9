"""The vLLM KV connector V1 interface kvstrand.vllm implements, and the
range of vLLM it is verified against.

Supported: vLLM v0.18 (the oldest verified) to vLLM main at commit 00f4240
(the newest verified). The suite runs the connector against a picture of
each (tests/python/vllm_pictures): v0.18 reports a failed load by block
ids (get_finished, get_block_ids_with_load_errors) and takes
handle_preemptions the step's metadata; 00f4240 reports per request
(get_transfer_results' failed_recving, the only report it accepts under
several KV-cache groups), labels Prometheus metrics through
vllm.v1.metrics.utils instead of make_per_engine, hands Mamba boundary
states to the connector (SchedulerOutput.kv_connector_block_state) and asks
has_pending_block_frees before it preempts. KvstrandConnector answers both.

When vLLM is installed its own classes are used, so vLLM sees a subclass of
its base; a vLLM module kvstrand needs that does not import is an error
naming it (never a silent stand-in). Without vLLM (drivers other than vLLM,
an install check) a local copy of the newest interface stands in: the same
names, arguments and defaults, without vLLM's imports.
"""

import enum
import importlib
import importlib.util
import logging
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Optional

log = logging.getLogger("kvstrand.vllm")

OLDEST_VERIFIED = (0, 18)
NEWEST_VERIFIED = "main at 00f4240"
# The release number vLLM's main carries at NEWEST_VERIFIED (0.29.0.dev0):
# a release past it is newer than anything verified.
NEWEST_VERIFIED_VERSION = (0, 29)
SUPPORTED = f"vLLM {OLDEST_VERIFIED[0]}.{OLDEST_VERIFIED[1]} to vLLM {NEWEST_VERIFIED}"
VLLM_INTERFACE_VERSION = SUPPORTED

_BASE = "vllm.distributed.kv_transfer.kv_connector.v1.base"
_METRICS = "vllm.distributed.kv_transfer.kv_connector.v1.metrics"


def _import_vllm():
    """vLLM's base and metrics modules, or None where vLLM is not installed.
    A module that does not import under an installed vLLM is an error
    naming it: a stand-in would let kvstrand run against an interface that
    is not the installed one."""
    if importlib.util.find_spec("vllm") is None:
        return None
    modules = []
    for name in (_BASE, _METRICS):
        try:
            modules.append(importlib.import_module(name))
        except Exception as e:  # noqa: BLE001 - any failure of vLLM's own import says the same
            raise ImportError(f"kvstrand.vllm: vLLM is installed but {name} does not import "
                              f"({type(e).__name__}: {e}); kvstrand.vllm is verified with {SUPPORTED}",
                              name=name) from e
    return modules


def vllm_version():
    """The installed vLLM's version string, or None."""
    try:
        return str(importlib.import_module("vllm").__version__)
    except (ImportError, AttributeError):
        return None


def version_outside_range(version):
    """Why `version` is outside the verified range, or None. Compared as
    (major, minor): vLLM 1.x is newer than 0.29, not older than 0.18."""
    m = re.match(r"(\d+)\.(\d+)", version or "")
    if m is None:
        return f"vLLM {version!r} has no version number kvstrand can read"
    number = (int(m.group(1)), int(m.group(2)))
    if number < OLDEST_VERIFIED:
        return f"vLLM {version} is older than the oldest verified"
    if number > NEWEST_VERIFIED_VERSION:
        return f"vLLM {version} is newer than the newest verified"
    return None


_vllm = _import_vllm()
VLLM_AVAILABLE = _vllm is not None

if VLLM_AVAILABLE:
    KVConnectorBase_V1 = _vllm[0].KVConnectorBase_V1
    KVConnectorMetadata = _vllm[0].KVConnectorMetadata
    KVConnectorRole = _vllm[0].KVConnectorRole
    SupportsHMA = _vllm[0].SupportsHMA
    KVConnectorStats = _vllm[1].KVConnectorStats
    KVConnectorPromMetrics = _vllm[1].KVConnectorPromMetrics

# Load results as the newest vLLM takes them (its own class where it has
# one; an older vLLM never asks for them).
KVConnectorTransferResults = getattr(_vllm[0], "KVConnectorTransferResults", None) if _vllm else None
if KVConnectorTransferResults is None:
    @dataclass
    class KVConnectorTransferResults:
        finished_sending: set = field(default_factory=set)
        finished_recving: set = field(default_factory=set)  # failed receives are here too
        failed_recving: set = field(default_factory=set)
        prefix_replay_checkpoints: dict = field(default_factory=dict)

if not VLLM_AVAILABLE:
    class KVConnectorRole(enum.Enum):
        SCHEDULER = 0  # the connector in the scheduler process
        WORKER = 1     # the connector in each worker process

    class KVConnectorMetadata(ABC):  # noqa: B024 - an abstract marker, as in vLLM
        """What the scheduler-side connector hands the worker-side one each step."""

    class SupportsHMA(ABC):
        """Marks a connector that serves vLLM's hybrid allocator (several
        KV-cache groups); vLLM then calls request_finished_all_groups."""

        @abstractmethod
        def request_finished_all_groups(self, request: Any, block_ids: tuple) -> tuple: ...

    @dataclass
    class KVConnectorStats:
        """A connector's telemetry for one interval, sent from the workers to
        the scheduler's logger (vLLM's metrics.KVConnectorStats)."""

        data: dict = field(default_factory=dict)

        def to_dict(self):
            return dict(self.data)

        def reset(self):
            raise NotImplementedError

        def aggregate(self, other):
            raise NotImplementedError

        def reduce(self):
            raise NotImplementedError

        def is_empty(self):
            raise NotImplementedError

    class KVConnectorPromMetrics:
        """Registers a connector's Prometheus metrics and records its stats
        (vLLM's metrics.KVConnectorPromMetrics): metric_types maps
        prometheus_client's Gauge, Counter and Histogram to the classes to
        make (keyed here by class name: prometheus_client may be absent)."""

        def __init__(self, vllm_config: Any, metric_types: dict, labelnames: list, per_engine_labelvalues: dict):
            self._kv_transfer_config = vllm_config.kv_transfer_config
            by_name = {k.__name__: v for k, v in metric_types.items()}
            self._gauge_cls = by_name["Gauge"]
            self._counter_cls = by_name["Counter"]
            self._histogram_cls = by_name["Histogram"]
            self._labelnames = labelnames
            self.per_engine_labelvalues = per_engine_labelvalues

        def observe(self, transfer_stats_data: dict, engine_idx: int = 0):
            raise NotImplementedError

    class KVConnectorBase_V1(ABC):
        """A local copy of vLLM's interface (see the module's docstring)."""

        def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any):
            self._connector_metadata: Optional[KVConnectorMetadata] = None
            self._vllm_config = vllm_config
            if getattr(vllm_config, "kv_transfer_config", None) is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self) -> KVConnectorRole:
            return self._role

        # ---- worker side ----
        def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> KVConnectorMetadata:
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None

        def register_kv_caches(self, kv_caches: dict) -> None:
            return

        def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
            return

        @abstractmethod
        def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None: ...

        @abstractmethod
        def wait_for_layer_load(self, layer_name: str) -> None: ...

        @abstractmethod
        def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None: ...

        @abstractmethod
        def wait_for_save(self) -> None: ...

        def get_finished(self, finished_req_ids: set) -> tuple:
            return None, None

        def get_transfer_results(self, finished_req_ids: set) -> KVConnectorTransferResults:
            sending, recving = self.get_finished(finished_req_ids)
            return KVConnectorTransferResults(set(sending or ()), set(recving or ()))

        def finish_forward(self) -> None:
            return

        def reset_capture_state(self) -> None:
            return

        def get_block_ids_with_load_errors(self) -> set:
            return set()

        def shutdown(self) -> None:
            return None

        # ---- scheduler side ----
        @abstractmethod
        def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple: ...

        @abstractmethod
        def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None: ...

        @abstractmethod
        def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata: ...

        def request_finished(self, request: Any, block_ids: list) -> tuple:
            return False, None

        def update_connector_output(self, connector_output: Any) -> None:
            return

        def take_events(self):
            return ()

        def has_pending_block_frees(self) -> bool:
            return False

        def get_kv_connector_kv_cache_events(self):
            return None

        @property
        def requires_kv_delivery(self) -> bool:
            return self._kv_transfer_config.is_kv_producer

        def get_kv_connector_stats(self):
            return None

        @classmethod
        def build_kv_connector_stats(cls, data: Optional[dict] = None):
            return None

        @classmethod
        def build_prom_metrics(cls, vllm_config: Any, metric_types: dict, labelnames: list,
                               per_engine_labelvalues: dict):
            return None

        def reset_cache(self) -> Optional[bool]:
            return None

        @classmethod
        def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
            return None
