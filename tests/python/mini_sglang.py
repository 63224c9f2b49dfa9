"""A small SGLang-shaped engine over one picture of SGLang (sglang_pictures/,
KVSTRAND_SGLANG_PICTURE): TP ranks, each with its host pool and its
StorageController (the picture's call order into kvstrand.sglang), run in
lockstep as SGLang's ranks do, hit counts and completed pages all-reduced
with MIN. Every page it resumes from the node tier is checked against a
recompute; the KV of a page is a function of its chained hash (and the
rank, but for MLA), as a model's is of its prefix."""

import hashlib
import importlib
import os
import sys

import numpy as np

PICTURE = os.environ.setdefault("KVSTRAND_SGLANG_PICTURE", "newest")
_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(_here, "sglang_pictures", PICTURE))

from sglang_host_pools import MambaHostPool, MHAHostPool, MLAHostPool  # noqa: E402

controller = importlib.import_module("sglang.srt.managers.cache_controller")
storage = importlib.import_module("sglang.srt.mem_cache.hicache_storage")
HAS_V2 = hasattr(storage, "PoolTransfer")


def page_hashes(tokens, page_size, prior=None):
    """SGLang's page keys: SHA-256 over the previous page's key and this
    page's token ids (4 bytes each, little-endian), as 64 hex digits."""
    out = []
    for start in range(0, len(tokens) - len(tokens) % page_size, page_size):
        h = hashlib.sha256()
        if prior:
            h.update(bytes.fromhex(prior))
        for t in tokens[start:start + page_size]:
            h.update(int(t).to_bytes(4, "little"))
        prior = h.hexdigest()
        out.append(prior)
    return out


def expected(page_hash, rank, shape, what="kv"):
    seed = int.from_bytes(hashlib.sha256(f"{what}:{page_hash}:{rank}".encode()).digest()[:8], "little")
    return np.random.default_rng(seed).integers(0, 256, int(np.prod(shape)), dtype=np.uint8).reshape(shape)


class Rank:
    def __init__(self, engine, tp_rank, extra):
        e = engine
        self.tp_rank = tp_rank
        self.pool = MLAHostPool(e.pages, e.page_size) if e.mla else MHAHostPool(e.layout, e.pages, e.page_size)
        self.ctrl = controller.StorageController(self.pool, e.page_size, tp_rank, e.tp, e.mla, e.model, extra,
                                                 prefetch_threshold=e.prefetch_threshold)
        self.mamba = None
        if e.mamba:
            self.mamba = MambaHostPool(e.pages)
            self.ctrl.register_side_pool(storage.PoolName.MAMBA, self.mamba)
        self.free = list(range(e.pages))

    def kv_rank(self, engine):
        return 0 if engine.mla else self.tp_rank

    def alloc(self, n):
        pages, self.free = self.free[:n], self.free[n:]
        assert len(pages) == n, "the host pool is out of pages"
        return pages

    def indices(self, pages, page_size):
        return np.concatenate([np.arange(p * page_size, (p + 1) * page_size) for p in pages]) if pages else \
            np.zeros(0, dtype=np.int64)


class MiniSGLang:
    def __init__(self, socket, *, tp=1, mla=False, layout="page_first", page_size=16, pages=64, model="mini-sglang",
                 mamba=False, prefetch_threshold=16, sockets=None, **extra):
        self.tp, self.mla, self.layout, self.page_size, self.pages = tp, mla, layout, page_size, pages
        self.model, self.mamba, self.prefetch_threshold = model, mamba, prefetch_threshold
        self.mismatches = 0
        self.ranks = []
        for r in range(tp):
            cfg = {"backend_name": "kvstrand", "module_path": "kvstrand.sglang", "class_name": "KvstrandStorage",
                   "interface_v1": 1, "server_socket": (sockets or {}).get(r, socket), "copy_threads": 1}
            cfg.update(extra)
            self.ranks.append(Rank(self, r, cfg))

    def backend(self, r=0):
        return self.ranks[r].ctrl.storage_backend

    def serve(self, tokens, save_mamba_at=None):
        """One request: the node tier's hit (MIN across ranks), loaded and
        checked, the rest computed, every page backed up. Returns the
        pages resumed from the tier. `save_mamba_at`: the pages whose end
        gets a Mamba state stored (default: the last)."""
        hashes = page_hashes(tokens, self.page_size)
        if not hashes:
            return 0
        transfers = {}
        if self.mamba:
            hits = []
            for rank in self.ranks:
                t = storage.PoolTransfer(name=storage.PoolName.MAMBA, keys=[None],
                                         hit_policy=storage.PoolHitPolicy.TRAILING_PAGES)
                transfers[rank.tp_rank] = t
                hits.append(rank.ctrl.hybrid_hit_query(hashes, [t]).kv_hit_pages)
        else:
            hits = [len(rank.ctrl.storage_hit_query(hashes)) for rank in self.ranks]
        hit = min(hits)  # SGLang's all-reduce MIN over the TP group
        if hit * self.page_size < self.prefetch_threshold:
            hit = 0  # revoked: no get follows the hit query
        held = {r.tp_rank: r.alloc(len(hashes)) for r in self.ranks}
        done = hit
        if hit:
            done = min(r.ctrl.page_transfer(hashes[:hit], r.indices(held[r.tp_rank][:hit], self.page_size))
                       for r in self.ranks)
        if self.mamba and done:
            for r in self.ranks:  # the side pool, once, only after the KV prefix loaded in full
                t = transfers[r.tp_rank]
                if done != hit or not t.keys:
                    done = 0
                    break
                slot = [held[r.tp_rank][0]]  # a Mamba slot of the request's own
                t.host_indices = np.asarray(slot, dtype=np.int64)
                got = r.ctrl.side_pools_get([t])
                if got.get("mamba", 0) != 1:
                    done = 0
                    break
                if not np.array_equal(r.mamba.read_state(slot[0]),
                                      expected(t.keys[0], r.tp_rank, (r.mamba.state_bytes(),), "mamba")):
                    self.mismatches += 1
        for r in self.ranks:
            for i, h in enumerate(hashes):
                p = held[r.tp_rank][i]
                want = expected(h, r.kv_rank(self), r.pool.page_shape())
                if i < done:
                    if not np.array_equal(r.pool.read_page(p), want):
                        self.mismatches += 1
                else:
                    r.pool.write_page(p, want)  # computed
            r.ctrl.page_backup(hashes, r.indices(held[r.tp_rank], self.page_size))
            if self.mamba:
                for at in (save_mamba_at if save_mamba_at is not None else [len(hashes)]):
                    slot = held[r.tp_rank][0]
                    r.mamba.write_state(slot, expected(hashes[at - 1], r.tp_rank, (r.mamba.state_bytes(),), "mamba"))
                    t = storage.PoolTransfer(name=storage.PoolName.MAMBA, keys=[hashes[at - 1]],
                                             host_indices=np.asarray([slot], dtype=np.int64))
                    r.ctrl.side_pools_set([t])
            r.free += held[r.tp_rank]
        return done

    def close(self):
        for r in self.ranks:
            r.ctrl.close()
