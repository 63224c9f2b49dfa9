"""A picture of SGLang's storage-backend interface at bb424de
(python/sglang/srt/mem_cache/hicache_storage.py), the oldest kvstrand.sglang
serves: the v1 zero-copy calls exist (their base returns None), there is no
v2 and no PP, CP or DP field; written for kvstrand's tests from reading it."""

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import List, Optional


@dataclass
class HiCacheStorageConfig:
    tp_rank: int
    tp_size: int
    is_mla_model: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    extra_config: Optional[dict] = None


@dataclass
class HiCacheStorageExtraInfo:
    prefix_keys: Optional[List[str]] = (None,)  # sic: a tuple default at this commit
    extra_info: Optional[dict] = None


class HiCacheStorage(ABC):
    def register_mem_pool_host(self, mem_pool_host):
        self.mem_pool_host = mem_pool_host

    def batch_get_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
        pass  # None: a backend that does not override it ends the prefetch thread

    def batch_set_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
        pass

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
        n = 0
        while n < len(keys) and self.exists(keys[n]):
            n += 1
        return n

    def clear(self) -> None:
        pass

    def get_stats(self):
        return None
