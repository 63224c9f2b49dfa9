"""kvstrand.vllm: a vLLM KV connector (V1 interface, hybrid allocator) over
kvstrand's node tier.

Follows vLLM's interface as interface.py cites it. It is tested against
vLLM's source through a miniature of vLLM's engine core
(tests/python/mini_vllm.py), not inside a running vLLM (which cannot be
installed where kvstrand is built and tested).
"""

from .config import ConnectorConfig
from .connector import KvstrandConnector
from .interface import (VLLM_AVAILABLE, VLLM_INTERFACE_VERSION, KVConnectorBase_V1, KVConnectorRole,
                        KVConnectorStats, SupportsHMA)
from .metadata import GroupPart, KvstrandConnectorMetadata, LoadJob, SaveJob
from .stats import KvstrandPromMetrics, KvstrandStats

__all__ = ["KvstrandConnector", "KvstrandConnectorMetadata", "LoadJob", "SaveJob", "GroupPart", "ConnectorConfig",
           "KvstrandStats", "KvstrandPromMetrics", "KVConnectorBase_V1", "KVConnectorRole", "KVConnectorStats", "SupportsHMA",
           "VLLM_AVAILABLE", "VLLM_INTERFACE_VERSION"]
