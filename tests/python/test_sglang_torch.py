"""kvstrand.sglang with SGLang's memory as it is on a GPU host: the device
pool a torch CUDA tensor (a layer-first K and V per layer, as SGLang's
MHATokenToKVPool), the host pool a pinned torch tensor in SGLang's
page_first layout, pages moved between them by torch (SGLang's own
device<->host copies) and between the host pool and kvstrand-server by
kvstrand.sglang. TP 1 and 2 (two ranks in this process, as two SGLang
processes would be), every page resumed byte for byte. Skipped where torch
has no GPU (it runs under gpu-python.sh)."""

import numpy as np
import pytest

import mini_sglang  # first: it puts the picture of SGLang on sys.path
from conftest import Server

try:
    import torch
except ImportError:  # Debian's interpreter here has no torch
    torch = None

needs_torch_gpu = pytest.mark.skipif(torch is None or not torch.cuda.is_available(),
                                     reason="needs torch with a GPU")

PAGE, PAGES, LAYERS, HEADS, DIM = 16, 32, 4, 2, 64


class TorchHostPool:
    """SGLang's page_first MHA host pool: (2, size, layers, heads, dim) in
    pinned memory (2-byte elements, int16 rather than bf16 so that every
    bit pattern compares equal to itself); get_page_buffer_meta as SGLang's."""

    def __init__(self):
        self.layout, self.page_size, self.page_num, self.size = "page_first", PAGE, PAGES, PAGES * PAGE
        self.dtype = torch.int16
        self.kv_buffer = torch.zeros((2, self.size, LAYERS, HEADS, DIM), dtype=torch.int16, pin_memory=True)

    def get_page_buffer_meta(self, indices):
        idx = [int(i) for i in indices.tolist()]
        tok = LAYERS * HEADS * DIM * 2
        base, v_off = self.kv_buffer.data_ptr(), self.kv_buffer[0].numel() * 2
        ptrs = []
        for first in idx[::PAGE]:
            ptrs += [base + first * tok, base + first * tok + v_off]
        return ptrs, [PAGE * tok] * len(ptrs)


def page_kv(page_hash, rank):
    """A page's KV (2, PAGE, LAYERS, HEADS, DIM): a function of its prefix and rank."""
    raw = mini_sglang.expected(page_hash, rank, (2, PAGE, LAYERS, HEADS, DIM * 2))
    return torch.from_numpy(raw.copy()).view(torch.int16)


class Rank:
    def __init__(self, socket, tp_rank, tp):
        self.device = torch.zeros((2, LAYERS, PAGES * PAGE, HEADS, DIM), dtype=torch.int16, device="cuda")
        self.host = TorchHostPool()
        extra = {"backend_name": "kvstrand", "module_path": "kvstrand.sglang", "class_name": "KvstrandStorage",
                 "interface_v1": 1, "server_socket": socket}
        self.ctrl = mini_sglang.controller.StorageController(self.host, PAGE, tp_rank, tp, False, "torch-sglang",
                                                             extra, prefetch_threshold=PAGE)
        self.rank = tp_rank

    def tokens(self, pages):
        return torch.cat([torch.arange(p * PAGE, (p + 1) * PAGE) for p in pages])

    def compute(self, hashes, pages):
        """The forward pass: each page's KV into the device pool."""
        for h, p in zip(hashes, pages):
            kv = page_kv(h, self.rank).to("cuda")  # (2, PAGE, LAYERS, HEADS, DIM)
            self.device[:, :, p * PAGE:(p + 1) * PAGE] = kv.transpose(1, 2)

    def device_to_host(self, pages):  # SGLang's write-back to its host pool
        t = self.tokens(pages).cuda()
        self.host.kv_buffer[:, self.tokens(pages)] = self.device[:, :, t].transpose(1, 2).cpu()

    def host_to_device(self, pages):  # SGLang's load from its host pool
        t = self.tokens(pages)
        self.device[:, :, t.cuda()] = self.host.kv_buffer[:, t].cuda().transpose(1, 2)

    def matches(self, hashes, pages):
        return all(torch.equal(self.device[:, :, p * PAGE:(p + 1) * PAGE].transpose(1, 2).cpu(), page_kv(h, self.rank))
                   for h, p in zip(hashes, pages))


@needs_torch_gpu
@pytest.mark.parametrize("tp", [1, 2])
def test_pages_go_device_host_tier_and_back_byte_for_byte(tp):
    server = Server(chunk_tokens=PAGE)
    try:
        tokens = list(range(7 * PAGE))
        hashes = mini_sglang.page_hashes(tokens, PAGE)
        first = [Rank(server.socket, r, tp) for r in range(tp)]
        pages = list(range(len(hashes)))
        for r in first:
            r.compute(hashes, pages)
            r.device_to_host(pages)
            assert r.ctrl.page_backup(hashes, r.tokens(pages).numpy()) == len(hashes)
        for r in first:
            r.ctrl.close()
        # SGLang restarted: empty pools, the prefix from the tier.
        again = [Rank(server.socket, r, tp) for r in range(tp)]
        hit = min(len(r.ctrl.storage_hit_query(hashes)) for r in again)
        assert hit == len(hashes)
        slots = list(range(10, 10 + hit))  # other host and device pages than before
        done = min(r.ctrl.page_transfer(hashes[:hit], r.tokens(slots).numpy()) for r in again)
        assert done == hit
        for r in again:
            r.host_to_device(slots)
            assert r.matches(hashes, slots)
            r.ctrl.close()
    finally:
        server.stop()
