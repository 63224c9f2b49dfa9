"""KvstrandStorage: SGLang's HiCacheStorage over kvstrand-server.

SGLang calls it from three threads (prefetch hit query, prefetch I/O,
backup) at once; the PageStore under it takes concurrent calls. A None or
an exception from batch_exists / batch_get_v1 / batch_set_v1 would end the
SGLang thread that called it for good (storage silently off, every later
prefetch hanging), so none escapes: a failure is a miss or False, said
once in the log and counted (``kvstrand_stats()``).

With ``public_tenant``, a second PageStore reads that tenant's published
KV pages (the server hands its memory over read-only): a hit's run starts
there and goes on in this engine's own pages; published pages are never
stored again here.
"""

import dataclasses
import hashlib
import logging
import threading
from dataclasses import dataclass

import kvstrand

from .config import StorageOptions
from .interface import HiCacheStorage, is_trailing, make_result, pool_name
from .pools import PagePool, describe

logger = logging.getLogger("kvstrand.sglang")

KV = "kv"


@dataclass(frozen=True)
class _Pool:
    pages: PagePool
    registration: int
    ns: bytes
    kv_rank: int
    writes: bool  # this rank stores the pool's pages (MLA's KV: rank 0 alone)


class KvstrandStorage(HiCacheStorage):
    def __init__(self, storage_config, kwargs=None):
        del kwargs  # the factory's: nothing kvstrand reads
        self._options = StorageOptions.of(storage_config)
        o = self._options
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        if not extra.get("interface_v1"):
            logger.warning("kvstrand.sglang: \"interface_v1\" is not set in the extra config: SGLang then uses its "
                           "generic calls, which kvstrand answers as misses; set \"interface_v1\": 1")
        self._store = kvstrand.PageStore(server_socket=o.server_socket, request_timeout=o.request_timeout_s,
                                         server_uid=o.server_uid, lease_bound=o.lease_bound_s,
                                         copy_threads=o.copy_threads)
        # The published tenant's KV pages, read-only (None: no public_tenant).
        self._public = None
        self._public_pool = None
        if o.public_tenant:
            self._public = kvstrand.PageStore(server_socket=o.server_socket, request_timeout=o.request_timeout_s,
                                              server_uid=o.server_uid, lease_bound=o.lease_bound_s,
                                              copy_threads=o.copy_threads, reads_tenant=o.public_tenant)
        self._pools = {}
        self._lock = threading.Lock()  # _pools and _said: registrations come from SGLang's scheduler thread
        self._said = set()
        self._failures = 0
        logger.info("kvstrand.sglang: kvstrand-server at %s, model %s, tp %d/%d%s", o.server_socket, o.model,
                    o.ranks.tp_rank, o.ranks.tp_size, " (MLA: rank 0 stores)" if o.ranks.is_mla else "")

    # ---- pools ------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host):
        super().register_mem_pool_host(mem_pool_host)
        self._add_pool(KV, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        if not hasattr(self, "registered_pools"):  # a base from before v2 has no such method
            self.registered_pools = {}
        self.registered_pools[host_pool_name] = host_pool
        self._add_pool(pool_name(host_pool_name), host_pool)

    def _add_pool(self, name, host_pool):
        with self._lock:
            if name in self._pools:
                return  # the KV pool named by both calls
        ranks = self._options.ranks
        # MLA's KV is the same on every TP rank: one copy, rank 0's. Side
        # pools (Mamba's state, SWA's window) are each rank's own.
        replicated = ranks.is_mla and name == KV
        pages = describe(host_pool, name)
        # A side pool's page is the state at the end of one KV page: as
        # many tokens as the KV pool's pages (registered first, by SGLang's
        # register_mem_pool_host).
        with self._lock:
            kv = self._pools.get(KV)
        tokens = pages.page_size if name == KV or kv is None else kv.pages.page_size
        reg = pages.registration(self._options, ranks, replicated, tokens)
        registration = self._store.register_layout(reg)
        pool = _Pool(pages, registration, kvstrand.namespace_of(reg.layout), 0 if replicated else ranks.tp_rank,
                     not replicated or ranks.tp_rank == 0)
        public = None
        if name == KV and self._public is not None:
            # The publisher's namespace: its tenant, no salt (its readers could not name its pages otherwise).
            published = dataclasses.replace(self._options, tenant=self._options.public_tenant, tenant_salt="")
            preg = pages.registration(published, ranks, replicated, tokens)
            public = _Pool(pages, self._public.register_layout(preg), kvstrand.namespace_of(preg.layout),
                           pool.kv_rank, False)
        with self._lock:
            self._pools[name] = pool
            if public is not None:
                self._public_pool = public
        logger.info("kvstrand.sglang: pool %s: %d pages of %d tokens, %d B a page in %d pieces (%s)", name,
                    pages.pages, pages.page_size, pages.page_bytes(), len(pages.pieces), pages.layout)

    def _pool(self, name):
        with self._lock:
            pool = self._pools.get(pool_name(name))
        if pool is None:
            raise LookupError(f"no host pool '{pool_name(name)}' was registered")
        return pool

    @staticmethod
    def _hash(key):
        # SGLang's keys are 64 hex digits of its page-chain SHA-256; any
        # other key is hashed so that it still names one chunk.
        if len(key) == 64:
            try:
                return bytes.fromhex(key)
            except ValueError:
                pass
        return hashlib.sha256(key.encode()).digest()

    def _keys(self, pool, keys):
        return [kvstrand.ChunkKey(pool.ns, pool.kv_rank, self._hash(k)) for k in keys]

    def _failed(self, what, error):
        with self._lock:
            self._failures += 1
            first = what not in self._said
            self._said.add(what)
        if first:
            logger.warning("kvstrand.sglang: %s failed (%s: %s); answered as a miss, SGLang goes on (said once; "
                           "kvstrand_stats() counts them)", what, type(error).__name__, error)

    # ---- the v1 calls: the KV pool --------------------------------------------------

    def batch_exists(self, keys, extra_info=None):
        del extra_info
        try:
            if not keys:
                return 0
            pool = self._pool(KV)
            keys = list(keys)
            start = self._published_run(keys, True)
            if start == len(keys):
                return start
            return start + int(self._store.exists(pool.registration, self._keys(pool, keys[start:])))
        except Exception as e:  # noqa: BLE001 - see the module's docstring
            self._failed("batch_exists", e)
            return 0

    def _published_run(self, keys, keep):
        """How many of the KV pool's `keys`, from the first, the published
        tenant holds (0 without public_tenant); `keep` leases them for the get."""
        with self._lock:
            public = self._public_pool
        if public is None or not keys:
            return 0
        return int(self._public.exists(public.registration, self._keys(public, keys), keep))

    def _get(self, name, keys, host_indices):
        n = 0
        try:
            if keys:
                pool = self._pool(name)
                pages = pool.pages.pages_of(host_indices, len(keys))
                if pages is None:
                    raise ValueError(f"{len(keys)} pages named by host indices that are not whole pages of pool {name}")
                with self._lock:
                    public = self._public_pool if pool_name(name) == KV else None
                if public is not None:  # the published run first, then this engine's own from its end
                    n = int(self._public.get(public.registration, self._keys(public, keys), pages))
                if n < len(keys):
                    n += int(self._store.get(pool.registration, self._keys(pool, keys[n:]), pages[n:]))
        except Exception as e:  # noqa: BLE001
            self._failed(f"a get of pool {pool_name(name)}", e)
        return [True] * n + [False] * (len(keys) - n)

    def _set(self, name, keys, host_indices):
        try:
            if not keys:
                return []
            pool = self._pool(name)
            if not pool.writes:
                return [True] * len(keys)  # rank 0 stores this pool's pages
            pages = pool.pages.pages_of(host_indices, len(keys))
            if pages is None:
                raise ValueError(f"{len(keys)} pages named by host indices that are not whole pages of pool {name}")
            # Published pages are in the tier already: not stored again under this tenant.
            published = self._published_run(keys, False) if pool_name(name) == KV else 0
            stored = self._store.set(pool.registration, self._keys(pool, keys[published:]), pages[published:])
            return [True] * published + [bool(x) for x in stored]
        except Exception as e:  # noqa: BLE001
            self._failed(f"a set of pool {pool_name(name)}", e)
            return [False] * len(keys)

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        del extra_info
        return self._get(KV, list(keys), host_indices)

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        del extra_info
        return self._set(KV, list(keys), host_indices)

    # ---- the v2 calls: hybrid models' pools ------------------------------------------

    def _holds(self, name, keys, keep):
        pool = self._pool(name)
        return int(self._store.exists(pool.registration, self._keys(pool, keys), keep)) if keys else 0

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The greatest end point legal for every pool: the KV pages up to
        it, each ALL_PAGES pool's pages up to it, and each TRAILING_PAGES
        pool's last n pages before it (not the least of each pool's own
        longest run: a Mamba state at page 7 does not make page 9 legal)."""
        del extra_info
        try:
            keys = list(keys)
            end = self.batch_exists(keys)
            found = {}
            trailing = []
            for t in pool_transfers or []:
                name = pool_name(t.name)
                if name == KV:
                    continue
                if is_trailing(t.hit_policy):
                    trailing.append((name, max(1, len(t.keys or []))))
                    continue
                run = self._holds(name, keys[:end], True) if end else 0
                found[name] = run
                end = min(end, run)
            if trailing:
                while end > 0 and not all(self._holds(name, keys[max(0, end - n):end], False) == min(n, end)
                                          for name, n in trailing):
                    end -= 1
                for name, n in trailing:
                    # Leased now, for the batch_get_v2 of exactly these pages.
                    found[name] = self._holds(name, keys[max(0, end - n):end], True) if end else 0
            return make_result(end, found)
        except Exception as e:  # noqa: BLE001
            self._failed("batch_exists_v2", e)
            return make_result(0, {})

    def batch_get_v2(self, transfers, extra_info=None):
        del extra_info
        return {pool_name(t.name): self._get(t.name, list(t.keys or []), t.host_indices) for t in transfers}

    def batch_set_v2(self, transfers, extra_info=None):
        del extra_info
        return {pool_name(t.name): self._set(t.name, list(t.keys or []), t.host_indices) for t in transfers}

    # ---- the generic calls (interface_v1 unset): misses, never wrong -------------------

    def exists(self, key):
        return self.batch_exists([key]) == 1

    def get(self, key, target_location=None, target_sizes=None):
        return None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        return [None] * len(keys)

    def set(self, key, value=None, target_location=None, target_sizes=None):
        return False

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        return False

    # ---- operations -------------------------------------------------------------------

    def clear(self):
        """SGLang's /clear_hicache_storage_backend: drops this model's pages
        (every pool's namespace) from the node tier, for every engine there."""
        with self._lock:
            pools = list(self._pools.values())
        for pool in pools:
            try:
                self._store.invalidate(pool.registration)
            except Exception as e:  # noqa: BLE001
                self._failed("clear", e)

    def get_stats(self):
        return None  # SGLang's storage metrics take its own backends' objects; see kvstrand_stats()

    def kvstrand_stats(self):
        stats = dict(self._store.stats())
        if self._public is not None:
            stats.update({f"public_{k}": v for k, v in self._public.stats().items()})
        stats["calls_failed_here"] = self._failures
        return stats

    def close(self):
        self._store.close()
        if self._public is not None:
            self._public.close()
