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

from mini_vllm import BLOCK, HEAD, HEADS, MiniVllm, kv_offset, kv_shape

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
