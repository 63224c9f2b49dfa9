"""kvstrand.vllm: a vLLM KV connector (V1 interface) over kvstrand's node tier.

Follows the interface of vLLM 0.18 (see interface.py). It is tested against
that documented interface, driven through vLLM's call order by
tests/python/test_vllm.py, not inside a running vLLM (which cannot be
installed where kvstrand is built and tested).
"""

from .config import ConnectorConfig
from .connector import KvstrandConnector
from .interface import VLLM_AVAILABLE, VLLM_INTERFACE_VERSION, KVConnectorBase_V1, KVConnectorRole
from .metadata import KvstrandConnectorMetadata, LoadJob, SaveJob

__all__ = ["KvstrandConnector", "KvstrandConnectorMetadata", "LoadJob", "SaveJob", "ConnectorConfig",
           "KVConnectorBase_V1", "KVConnectorRole", "VLLM_AVAILABLE", "VLLM_INTERFACE_VERSION"]
