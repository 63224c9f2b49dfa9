"""The oldest picture's HiCacheController storage calls (bb424de): v1 only.
The hit query asks batch_exists 128 pages at a time; a prefetch reads with
batch_get_v1 and stops at its first False; a backup writes with
batch_set_v1 and stops at the first batch that is not all True. MLA ranks
but 0 skip backups. MIN across ranks is the caller's (mini_sglang.py)."""

from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, HiCacheStorageExtraInfo
from sglang.srt.mem_cache.storage import StorageBackendFactory

BATCH = 128


class StorageController:
    def __init__(self, host_pool, page_size, tp_rank, tp_size, is_mla, model_name, extra_config,
                 prefetch_threshold=256):
        self.mem_pool_host = host_pool
        self.page_size = page_size
        self.storage_config = HiCacheStorageConfig(tp_rank, tp_size, is_mla, host_pool.layout == "page_first",
                                                   model_name, dict(extra_config))
        self.backup_skip = is_mla and tp_rank != 0
        self.storage_backend = StorageBackendFactory.create_backend("dynamic", self.storage_config, host_pool)
        self.storage_backend.register_mem_pool_host(host_pool)
        self.prefetch_threshold = max(prefetch_threshold, page_size)
        if not extra_config.get("interface_v1"):
            raise ValueError("this picture draws the zero-copy (interface_v1) path only")

    def _span(self, host_indices, first, count):
        return host_indices[first * self.page_size:(first + count) * self.page_size]

    def storage_hit_query(self, page_hashes):
        found = 0
        while found < len(page_hashes):
            batch = page_hashes[found:found + BATCH]
            n = self.storage_backend.batch_exists(batch)
            found += n
            if n != len(batch):
                break
        return page_hashes[:found]

    def page_transfer(self, hashes, host_indices, revoked=lambda: False):
        done = 0
        while done < len(hashes) and not revoked():
            batch = hashes[done:done + BATCH]
            flags = self.storage_backend.batch_get_v1(batch, self._span(host_indices, done, len(batch)),
                                                      HiCacheStorageExtraInfo())
            ok = next((i for i, f in enumerate(flags) if not f), len(batch))
            done += ok
            if ok != len(batch):
                break
        return done

    def page_backup(self, hashes, host_indices):
        if self.backup_skip:
            return 0
        done = 0
        while done < len(hashes):
            batch = hashes[done:done + BATCH]
            if not all(self.storage_backend.batch_set_v1(batch, self._span(host_indices, done, len(batch)))):
                break
            done += len(batch)
        return done

    def close(self):
        if hasattr(self.storage_backend, "close"):
            self.storage_backend.close()
