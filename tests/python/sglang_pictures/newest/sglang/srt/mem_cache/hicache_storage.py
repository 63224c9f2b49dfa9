"""A picture of SGLang's storage-backend interface at 001067f
(python/sglang/srt/mem_cache/hicache_storage.py): the types and the base
class a backend sees, written for kvstrand's tests from reading that file."""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import Enum
from typing import Any, List, Optional

STORAGE_BATCH_SIZE = 128  # pages per storage call at most


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


class PoolName(str, Enum):
    KV = "kv"
    MAMBA = "mamba"
    SWA = "swa"
    INDEXER = "indexer"

    def __str__(self):
        return self.value


class PoolHitPolicy(str, Enum):
    ALL_PAGES = "all_pages"  # every page up to the hit
    TRAILING_PAGES = "trailing_pages"  # the last len(keys) pages of the hit


@dataclass
class PoolTransfer:
    name: PoolName
    host_indices: Any = None
    device_indices: Any = None
    keys: Optional[List[str]] = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    nodes_to_load: Optional[List[Any]] = None
    indices_from_pool: Optional[PoolName] = None


@dataclass
class PoolTransferResult:
    kv_hit_pages: int
    extra_pool_hit_pages: dict


def count_pool_hits(results):
    """Each pool's leading run of True."""
    return {name: (flags.index(False) if False in flags else len(flags)) for name, flags in results.items()}


class HiCacheStorage(ABC):
    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        if not hasattr(self, "registered_pools"):
            self.registered_pools = {}
        self.registered_pools[host_pool_name] = host_pool

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None) -> PoolTransferResult:
        raise NotImplementedError()

    def batch_get_v2(self, transfers, extra_info=None) -> dict:
        raise NotImplementedError()

    def batch_set_v2(self, transfers, extra_info=None) -> dict:
        raise NotImplementedError()

    # SGLang raises here rather than returning None: a None kills the thread
    # that called it (it indexes or all()s the result).
    def batch_get_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
        raise NotImplementedError()

    def batch_set_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
        raise NotImplementedError()

    @abstractmethod
    def get(self, key, target_location=None, target_sizes=None):
        pass

    @abstractmethod
    def batch_get(self, keys, target_locations=None, target_sizes=None):
        pass

    @abstractmethod
    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
        pass

    @abstractmethod
    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
        pass

    @abstractmethod
    def exists(self, key) -> bool:
        pass

    def batch_exists(self, keys, extra_info=None) -> int:
        for i, key in enumerate(keys):
            if not self.exists(key):
                return i
        return len(keys)

    def clear(self) -> None:
        pass

    def get_stats(self):
        return None
