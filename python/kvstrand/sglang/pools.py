"""SGLang's host pools as kvstrand registrations: each piece of a page (an
MHA page's K and V, a layer's slice in layer_first, an MLA page, a Mamba
slot) is a plane whose block p is page p's piece, found once by asking the
pool where pages 0, 1 and the last one are (``get_page_buffer_meta``). A
batch's pages are then block numbers, with no call into the pool and no
Python loop per page."""

from dataclasses import dataclass

import numpy as np

import kvstrand

from .config import Ranks


def _indices(values):
    try:  # SGLang's pools take CPU tensors; NumPy arrays where torch is absent
        import torch

        return torch.tensor(values, dtype=torch.int64)
    except ImportError:
        return np.asarray(values, dtype=np.int64)


def as_array(indices):
    """Host indices (a CPU tensor, a NumPy array, a list) as an int64 array."""
    if hasattr(indices, "cpu"):
        indices = indices.cpu().numpy()
    return np.asarray(indices, dtype=np.int64)


@dataclass(frozen=True)
class PagePool:
    """One host pool as kvstrand sees it."""

    name: str
    page_size: int  # host indices per page (tokens; a Mamba pool's slot is one)
    pages: int
    pieces: tuple  # (address of page 0's piece, bytes) per piece
    layout: str
    dtype: str

    def page_bytes(self):
        return sum(b for _, b in self.pieces)

    def registration(self, options, ranks: Ranks, replicated: bool, tokens: int):
        """The registration of this pool's pages, each the state after
        `tokens` more tokens (the KV pool's page size: a side pool's slot
        is the state at the end of one KV page); its layout (and so its
        namespace) names the model, the pool, its layout and shape, the
        ranks' split, the tenant and the weights."""
        layout = kvstrand.Layout(
            model_id=options.model,
            layout_name=f"sglang:{self.name}:{self.layout}{ranks.part()}",
            planes=[kvstrand.Plane(f"piece{j}", b) for j, (_, b) in enumerate(self.pieces)],
            block_tokens=tokens,
            chunk_tokens=tokens,
            dtype=self.dtype,
            tenant_salt=options.tenant_salt,
            tp_size=ranks.tp_size,
            tp_rank=ranks.tp_rank,
            replicated_across_tp=replicated,
            weight_version=options.weight_version,
            tenant=options.tenant,
        )
        planes = [kvstrand.PlaneMemory(base, self.pages) for base, _ in self.pieces]
        return kvstrand.Registration(layout, planes)

    def pages_of(self, host_indices, count):
        """The blocks of `count` pages named by SGLang's host indices (one
        index per token, pages whole and in order), or None when the
        indices are not that."""
        idx = as_array(host_indices)
        if idx.size != count * self.page_size:
            return None
        firsts = idx[:: self.page_size]
        if np.any(firsts % self.page_size) or np.any(firsts < 0):
            return None
        blocks = firsts // self.page_size
        if np.any(blocks >= self.pages):
            return None
        return blocks.astype(np.uint32)


def describe(pool, name):
    """The PagePool of SGLang host pool `pool`, or ConfigError naming why
    kvstrand cannot address its pages."""
    page = int(getattr(pool, "page_size", 1) or 1)
    layout = str(getattr(pool, "layout", "page_first"))
    pages = getattr(pool, "page_num", None)
    if pages is None:
        pages = int(getattr(pool, "size")) // page
    pages = int(pages)
    if pages < 1:
        raise kvstrand.ConfigError(f"invalid option 'hicache-size': SGLang's host pool '{name}' holds no page")

    def where(p):
        ptrs, sizes = pool.get_page_buffer_meta(_indices(list(range(p * page, (p + 1) * page))))
        return [int(x) for x in ptrs], [int(x) for x in sizes]

    first, sizes = where(0)
    if not first or len(first) != len(sizes) or any(s <= 0 for s in sizes):
        raise kvstrand.ConfigError(f"invalid option 'hicache-mem-layout': SGLang's host pool '{name}' ({layout}) "
                                   "describes a page as no pieces")
    for p in sorted({1, pages - 1} - {0}):
        at, sz = where(p)
        if sz != sizes or any(a != f + p * s for a, f, s in zip(at, first, sizes)):
            raise kvstrand.ConfigError(
                f"invalid option 'hicache-mem-layout': SGLang's host pool '{name}' ({layout}) does not keep each "
                "piece of a page at a fixed stride of its own size; kvstrand.sglang serves page_first, "
                "page_first_direct, page_head and layer_first pools")
    dtype = str(getattr(pool, "dtype", "")).replace("torch.", "") or "bytes"
    return PagePool(name=name, page_size=page, pages=pages, pieces=tuple(zip(first, sizes)), layout=layout,
                    dtype=dtype)
