"""kvstrand.vllm's worker side on real torch CUDA tensors in vLLM's KV-cache
shapes (FlashAttention's two regions, MLA's one, a hybrid model's groups),
driven by the vLLM miniature against a real kvstrand-server. The toy
model's writes are queued on torch.cuda.current_stream() behind a sleep
kernel and never waited for by the engine: a save that did not wait for the
stream, or a load another stream's work could overtake, shows as a
mismatch. Skipped where torch has no GPU (it runs under gpu-python.sh)."""

import numpy as np
import pytest

import kvstrand

from mini_vllm import BLOCK, HEAD, HEADS, MiniVllm, hybrid_strides, kv_offset, kv_shape

try:
    import torch
except ImportError:  # Debian's interpreter here has no torch
    torch = None

# Skipped per test, not per module: a file that collects nothing fails its CTest entry.
needs_torch_gpu = pytest.mark.skipif(torch is None or not torch.cuda.is_available() or kvstrand.backend() == "sim",
                                     reason="needs torch with a GPU and kvstrand's cuda or hip backend")

PREFIX = list(range(1000, 1256))


class TorchKV:
    """A layer's KV cache as a bf16 CUDA tensor; writes are queued on the
    current stream, late (a sleep kernel first), as a forward pass's are."""

    def __init__(self, planes, num_blocks):
        self.tensor = torch.empty(kv_shape(planes, num_blocks), dtype=torch.bfloat16, device="cuda")
        self.bytes = self.tensor.view(torch.uint8).view(-1)
        self.planes, self.num_blocks = planes, num_blocks
        self.half_bytes = BLOCK * HEADS * HEAD * 2

    def write(self, half, block, data):
        at = kv_offset(self.planes, self.num_blocks, half, block)
        torch.cuda._sleep(200_000)  # the forward pass is still running when the step's saves are posted
        src = torch.from_numpy(np.ascontiguousarray(data)).pin_memory()
        self.bytes[at:at + self.half_bytes].copy_(src, non_blocking=True)

    def read(self, half, block):
        torch.cuda.current_stream().synchronize()
        at = kv_offset(self.planes, self.num_blocks, half, block)
        return self.bytes[at:at + self.half_bytes].cpu().numpy()


class TorchHybridKV(TorchKV):
    """An attention layer's cache in a Mamba hybrid, made as vLLM makes it:
    the (2, num_blocks, ...) bf16 tensor re-strided in place with
    as_strided_ so a block's K and V are adjacent (not contiguous)."""

    def __init__(self, planes, num_blocks):
        super().__init__(2, num_blocks)
        self.tensor.as_strided_(size=self.tensor.shape, stride=hybrid_strides())
        assert not self.tensor.is_contiguous()
        self.planes = 1  # in memory: one region per block, K then V


class TorchState:
    """A Mamba layer's state cache as vLLM lays it out in align mode: one page
    per block of a raw bf16 tensor, the conv state's view at the page's start
    and the SSM state's after it (torch.as_strided, a page apart), given to
    register_kv_caches as the list [conv, ssm]. Writes queued late on the
    current stream, as TorchKV's."""

    def __init__(self, num_blocks, page):
        self.page = page
        raw = torch.empty(num_blocks * page // 2, dtype=torch.bfloat16, device="cuda")
        conv = page // 8  # elements: a quarter of the page, the rest SSM state
        self.tensor = [torch.as_strided(raw, (num_blocks, conv), (page // 2, 1)),
                       torch.as_strided(raw, (num_blocks, page // 2 - conv), (page // 2, 1), conv)]
        self.bytes = raw.view(torch.uint8)

    def write(self, block, data):
        torch.cuda._sleep(200_000)
        src = torch.from_numpy(np.ascontiguousarray(data)).pin_memory()
        self.bytes[block * self.page:(block + 1) * self.page].copy_(src, non_blocking=True)

    def read(self, block):
        torch.cuda.current_stream().synchronize()
        return self.bytes[block * self.page:(block + 1) * self.page].cpu().numpy()


@needs_torch_gpu
@pytest.mark.parametrize("tp", [1, 2])
def test_torch_mamba_state_views_resume_byte_exact(block_server, tp):
    # The seed's shape on torch tensors: attention plus two single-layer Mamba
    # groups whose states are strided views of a page per block, the
    # attention caches in vLLM's hybrid layout (as_strided_, K and V of a
    # block adjacent), the newest vLLM's copy-on-write state blocks.
    vllm = MiniVllm(block_server.socket, tp=tp, groups=[("full", 2, 0), ("mamba", 1, 0), ("mamba", 1, 0)], caching=False,
                    tensor=TorchKV, hybrid_tensor=TorchHybridKV, state_tensor=TorchState, hybrid_invalid_blocks=True,
                    chunk_tokens=16, budget=64, mamba_external_assert=False)
    vllm.add("a", PREFIX[:150])
    vllm.run(timeout=60)
    b = vllm.add("b", PREFIX[:150])
    vllm.run(timeout=60)
    assert b.loaded == (0, 144) and vllm.stats["resumed"] == 1
    assert vllm.stats["mismatches"] == 0 and vllm.all_blocks_free(), vllm.mismatched
    vllm.shutdown()


@needs_torch_gpu
@pytest.mark.parametrize("tp, planes, groups", [
    (1, 2, None), (2, 2, None),                          # FlashAttention's (2, num_blocks, block, heads, head)
    (2, 1, None),                                        # MLA's single region per block
    (2, 2, [("full", 2, 0), ("sliding", 1, 32)]),        # a hybrid model's groups
])
def test_torch_cuda_kv_caches_save_after_and_load_before_the_current_streams_work(server, tp, planes, groups):
    vllm = MiniVllm(server.socket, tp=tp, planes=planes, groups=groups, caching=False, tensor=TorchKV,
                    hybrid_invalid_blocks=True)
    vllm.add("a", PREFIX + list(range(40)))
    vllm.run(timeout=60)
    vllm.add("b", PREFIX + list(range(500, 530)))
    vllm.run(timeout=60)
    assert vllm.stats["resumed"] == 1 and vllm.stats["loaded_tokens"] == 256
    assert vllm.stats["mismatches"] == 0 and vllm.all_blocks_free(), vllm.mismatched
    vllm.shutdown()
