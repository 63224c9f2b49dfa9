"""Pictures of SGLang's host pools (SGLang's sglang/srt/mem_cache/pool_host/
{mha,mla,mamba}.py at 001067f; memory_pool_host.py at bb424de, the same
layouts): host memory in each of SGLang's layouts, and get_page_buffer_meta
as SGLang answers it (the pointers and sizes of a page's pieces), over
NumPy instead of torch. The engine (mini_sglang.py) writes and reads pages
in one canonical shape; each pool keeps them in its own layout."""

import numpy as np

LAYOUTS = ("page_first", "layer_first", "page_first_direct", "page_head")


class MHAHostPool:
    """K and V of `layers` layers, `heads` heads of `elem` bytes a token."""

    def __init__(self, layout, pages, page_size, layers=3, heads=2, elem=32, dtype="bfloat16"):
        assert layout in LAYOUTS
        self.layout, self.page_size, self.page_num = layout, page_size, pages
        self.size = pages * page_size
        self.layers, self.heads, self.elem, self.dtype = layers, heads, elem, dtype
        shape = {
            "page_first": (2, self.size, layers, heads, elem),
            "layer_first": (2, layers, self.size, heads, elem),
            "page_first_direct": (2, pages, layers, page_size, heads, elem),
            "page_head": (2, pages, heads, page_size, layers, elem),
        }[layout]
        self.kv_buffer = np.zeros(shape, dtype=np.uint8)

    def page_shape(self):
        return (2, self.page_size, self.layers, self.heads, self.elem)

    def _view(self, p):
        """Page p as (2, page_size, layers, heads, elem), a view into the pool."""
        ps = self.page_size
        b = self.kv_buffer
        if self.layout == "page_first":
            return b[:, p * ps:(p + 1) * ps]
        if self.layout == "layer_first":
            return b[:, :, p * ps:(p + 1) * ps].transpose(0, 2, 1, 3, 4)
        if self.layout == "page_first_direct":
            return b[:, p].transpose(0, 2, 1, 3, 4)
        return b[:, p].transpose(0, 2, 3, 1, 4)  # page_head: (2, heads, ps, layers, elem)

    def write_page(self, p, kv):
        self._view(p)[...] = kv

    def read_page(self, p):
        return np.array(self._view(p))

    def get_page_buffer_meta(self, indices):
        idx = [int(i) for i in np.asarray(indices).tolist()]
        assert len(idx) % self.page_size == 0
        base = self.kv_buffer.ctypes.data
        v_off = self.kv_buffer[0].nbytes
        tok = self.heads * self.elem
        ptrs, sizes = [], []
        for first in idx[::self.page_size]:
            p = first // self.page_size
            if self.layout == "layer_first":
                for layer in range(self.layers):
                    k = base + (layer * self.size + first) * tok
                    ptrs += [k, k + v_off]
                    sizes += [self.page_size * tok] * 2
                continue
            page_bytes = self.page_size * self.layers * tok
            k = base + (first * self.layers * tok if self.layout == "page_first" else p * page_bytes)
            ptrs += [k, k + v_off]
            sizes += [page_bytes] * 2
        return ptrs, sizes


class MLAHostPool:
    """One latent vector of `elem` bytes a token and layer, page_first."""

    def __init__(self, pages, page_size, layers=3, elem=64, dtype="bfloat16"):
        self.layout, self.page_size, self.page_num = "page_first", page_size, pages
        self.size = pages * page_size
        self.layers, self.elem, self.dtype = layers, elem, dtype
        self.kv_buffer = np.zeros((self.size, layers, 1, elem), dtype=np.uint8)

    def page_shape(self):
        return (self.page_size, self.layers, 1, self.elem)

    def write_page(self, p, kv):
        self.kv_buffer[p * self.page_size:(p + 1) * self.page_size] = kv

    def read_page(self, p):
        return np.array(self.kv_buffer[p * self.page_size:(p + 1) * self.page_size])

    def get_page_buffer_meta(self, indices):
        idx = [int(i) for i in np.asarray(indices).tolist()]
        page_bytes = self.page_size * self.layers * self.elem
        base = self.kv_buffer.ctypes.data
        ptrs = [base + first * self.layers * self.elem for first in idx[::self.page_size]]
        return ptrs, [page_bytes] * len(ptrs)


class MambaHostPool:
    """One recurrent state a slot (conv and temporal states, two pieces);
    its indices are slots, one a page."""

    def __init__(self, slots, conv=256, temporal=768):
        self.layout, self.page_size, self.page_num, self.size = "page_first", 1, slots, slots
        self.dtype = "float32"
        self.conv = np.zeros((slots, conv), dtype=np.uint8)
        self.temporal = np.zeros((slots, temporal), dtype=np.uint8)

    def write_state(self, slot, state):
        c = self.conv.shape[1]
        self.conv[slot], self.temporal[slot] = state[:c], state[c:]

    def read_state(self, slot):
        return np.concatenate([self.conv[slot], self.temporal[slot]])

    def state_bytes(self):
        return self.conv.shape[1] + self.temporal.shape[1]

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        for s in np.asarray(indices).tolist():
            ptrs += [self.conv[int(s)].ctypes.data, self.temporal[int(s)].ctypes.data]
            sizes += [self.conv.shape[1], self.temporal.shape[1]]
        return ptrs, sizes
