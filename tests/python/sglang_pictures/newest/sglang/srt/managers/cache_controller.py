"""A picture of the storage half of SGLang's HiCacheController at 001067f
(python/sglang/srt/managers/cache_controller.py) and of the hybrid
controller's v2 hit query (mem_cache/hybrid_cache/hybrid_cache_controller.py):
the order in which it calls a storage backend. Threads and the TP process
group are the caller's (tests/python/mini_sglang.py): it all-reduces the
hit counts this returns with MIN, as SGLang's gloo groups do."""

from sglang.srt.mem_cache.hicache_storage import (STORAGE_BATCH_SIZE, HiCacheStorageConfig, HiCacheStorageExtraInfo,
                                                   PoolHitPolicy, PoolTransferResult, count_pool_hits)
from sglang.srt.mem_cache.storage import StorageBackendFactory


class StorageController:
    def __init__(self, host_pool, page_size, tp_rank, tp_size, is_mla, model_name, extra_config,
                 prefetch_threshold=256):
        self.mem_pool_host = host_pool
        self.page_size = page_size
        self.storage_config = HiCacheStorageConfig(
            tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=is_mla, enable_storage_metrics=False, is_page_first_layout=host_pool.layout == "page_first",
            model_name=model_name, extra_config=dict(extra_config))
        # MLA: only rank 0 backs up (every rank holds the same KV).
        self.backup_skip = is_mla and tp_rank != 0
        self.storage_backend = StorageBackendFactory.create_backend("dynamic", self.storage_config, host_pool)
        self.storage_backend.register_mem_pool_host(host_pool)
        self.prefetch_threshold = max(prefetch_threshold, page_size)
        zero_copy = bool(self.storage_config.extra_config.get("interface_v1", 0))
        self.page_get_func = self._page_get_zero_copy if zero_copy else self._generic_page_get
        self.page_set_func = self._page_set_zero_copy if zero_copy else self._generic_page_set

    # ---- prefetch: the hit query, then the transfer ------------------------------

    def storage_hit_query(self, page_hashes):
        """Batches of 128 until one is short: the pages this rank's backend
        holds (before the MIN across ranks)."""
        hit = []
        for start in range(0, len(page_hashes), STORAGE_BATCH_SIZE):
            batch = page_hashes[start:start + STORAGE_BATCH_SIZE]
            n = self.storage_backend.batch_exists(batch, HiCacheStorageExtraInfo())
            hit.extend(batch[:n])
            if n < len(batch):
                break
        return hit

    def _page_get_zero_copy(self, hashes, host_indices, extra_info):
        results = self.storage_backend.batch_get_v1(hashes, host_indices, extra_info)
        n = 0
        for ok in results:  # indexing a None here ends the prefetch thread
            if not ok:
                break
            n += 1
        return n

    def _generic_page_get(self, hashes, host_indices, extra_info):
        pages = self.storage_backend.batch_get(hashes, [None] * len(hashes))
        if pages is None:
            return 0
        n = 0
        for page in pages:
            if page is None:
                break
            n += 1
        return n

    def page_transfer(self, hashes, host_indices, revoked=lambda: False):
        """Batch by batch; the batch after a short one is not asked. Returns
        the completed pages (the caller all-reduces them with MIN)."""
        completed = 0
        for i in range(0, len(hashes), STORAGE_BATCH_SIZE):
            if revoked():
                break
            batch = hashes[i:i + STORAGE_BATCH_SIZE]
            idx = host_indices[i * self.page_size:(i + len(batch)) * self.page_size]
            got = self.page_get_func(batch, idx, HiCacheStorageExtraInfo())
            completed += got
            if got != len(batch):
                break
        return completed

    # ---- backup --------------------------------------------------------------------

    def _page_set_zero_copy(self, hashes, host_indices, extra_info):
        return all(self.storage_backend.batch_set_v1(hashes, host_indices, extra_info))

    def _generic_page_set(self, hashes, host_indices, extra_info):
        return self.storage_backend.batch_set(hashes, [None] * len(hashes))

    def page_backup(self, hashes, host_indices):
        """Batch by batch, stopping at the first batch not wholly stored:
        the pages backed up."""
        if self.backup_skip:
            return 0
        done = 0
        for i in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[i:i + STORAGE_BATCH_SIZE]
            idx = host_indices[i * self.page_size:(i + len(batch)) * self.page_size]
            if not self.page_set_func(batch, idx, HiCacheStorageExtraInfo()):
                break
            done += len(batch)
        return done

    # ---- the hybrid controller: side pools (v2) ------------------------------------------

    def register_side_pool(self, name, pool):
        self.storage_backend.register_mem_host_pool_v2(pool, name)

    def hybrid_hit_query(self, page_hashes, pool_transfers):
        """One batch_exists_v2 over every page; then each transfer's keys
        become the pages it loads: ALL_PAGES up to the hit, TRAILING_PAGES
        its last n."""
        result = self.storage_backend.batch_exists_v2(page_hashes, pool_transfers, HiCacheStorageExtraInfo())
        assert isinstance(result, PoolTransferResult)
        hit = result.kv_hit_pages
        for t in pool_transfers:
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                t.keys = page_hashes[:hit]
            else:
                n = len(t.keys) if t.keys else 1
                t.keys = page_hashes[max(0, hit - n):hit]
        return result

    def side_pools_get(self, transfers):
        """Read once per request, and only after the KV prefix loaded in full."""
        return count_pool_hits(self.storage_backend.batch_get_v2(transfers, HiCacheStorageExtraInfo()))

    def side_pools_set(self, transfers):
        return self.storage_backend.batch_set_v2(transfers, HiCacheStorageExtraInfo())

    def close(self):
        if hasattr(self.storage_backend, "close"):
            self.storage_backend.close()
