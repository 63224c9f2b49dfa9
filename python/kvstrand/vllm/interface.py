"""The vLLM KV connector V1 interface kvstrand.vllm implements.

Checked against vLLM's source at commit 003df29 of ``base.py`` and 00024d3
of ``vllm/v1/core/sched/scheduler.py`` (the scheduler's bookkeeping
tests/python/mini_vllm.py follows), which keep the interface of v0.18
(``vllm/distributed/kv_transfer/kv_connector/v1/base.py``:
``KVConnectorBase_V1(vllm_config, role, kv_cache_config)``, where
``handle_preemptions`` receives the step's connector metadata, as v0.18.2's
model runner calls it: bind_connector_metadata, handle_preemptions,
start_load_kv, the forward pass, wait_for_save, get_finished,
get_block_ids_with_load_errors, clear_connector_metadata). v0.15 passed
handle_preemptions a set of request ids instead; KvstrandConnector takes both.

When vLLM is importable its own classes are used, so vLLM sees a subclass of
its base. Otherwise (these machines cannot install vLLM) a local copy of the
interface stands in: the same class and method names, arguments and
defaults, without vLLM's imports (torch and the rest). Tests drive the
connector through the call order vLLM documents; they do not run vLLM.
"""

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Optional

VLLM_INTERFACE_VERSION = "0.18"

try:  # pragma: no cover - vLLM is not installable here
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
        SupportsHMA,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # type: ignore
        KVConnectorPromMetrics,
        KVConnectorStats,
    )

    VLLM_AVAILABLE = True
except ImportError:
    VLLM_AVAILABLE = False

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
        make; one labelled child per engine."""

        def __init__(self, vllm_config: Any, metric_types: dict, labelnames: list, per_engine_labelvalues: dict):
            self._kv_transfer_config = vllm_config.kv_transfer_config
            by_name = {k.__name__: v for k, v in metric_types.items()}
            self._gauge_cls = by_name["Gauge"]
            self._counter_cls = by_name["Counter"]
            self._histogram_cls = by_name["Histogram"]
            self._labelnames = labelnames
            self.per_engine_labelvalues = per_engine_labelvalues

        def make_per_engine(self, metric: Any) -> dict:
            return {idx: metric.labels(*values) for idx, values in self.per_engine_labelvalues.items()}

        def observe(self, transfer_stats_data: dict, engine_idx: int = 0):
            raise NotImplementedError

    class KVConnectorBase_V1(ABC):
        """A local copy of vLLM's interface (see the module's docstring)."""

        def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
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
