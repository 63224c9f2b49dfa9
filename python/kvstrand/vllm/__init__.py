"""kvstrand.vllm: a vLLM KV connector (V1 interface, hybrid allocator) over
kvstrand's node tier.

Verified with vLLM 0.18 to vLLM main at 00f4240 (interface.SUPPORTED). It is
tested through a miniature of vLLM's engine core (tests/python/mini_vllm.py)
against a picture of the oldest and of the newest vLLM
(tests/python/vllm_pictures), not inside a running vLLM (which cannot be
installed where kvstrand is built and tested).
"""

from .config import ConnectorConfig
from .connector import KvstrandConnector
from .interface import (SUPPORTED, VLLM_AVAILABLE, VLLM_INTERFACE_VERSION, KVConnectorBase_V1, KVConnectorRole,
                        KVConnectorStats, KVConnectorTransferResults, SupportsHMA)
from .metadata import GroupPart, KvstrandConnectorMetadata, LoadJob, SaveJob
from .stats import KvstrandPromMetrics, KvstrandStats

__all__ = ["KvstrandConnector", "KvstrandConnectorMetadata", "LoadJob", "SaveJob", "GroupPart", "ConnectorConfig",
           "KvstrandStats", "KvstrandPromMetrics", "KVConnectorBase_V1", "KVConnectorRole", "KVConnectorStats", "SupportsHMA",
           "KVConnectorTransferResults", "SUPPORTED", "VLLM_AVAILABLE", "VLLM_INTERFACE_VERSION"]
