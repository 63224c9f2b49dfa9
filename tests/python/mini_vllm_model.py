"""The toy model and the data of mini_vllm.py's miniature of vLLM (written
for kvstrand from reading vLLM's source, not copied from it): the picture
followed, the KV-cache specs and tensors, requests, block hashes, the
configurations kvstrand.vllm is given, and the model's checks.

- Requests with vLLM's statuses (WAITING, WAITING_FOR_REMOTE_KVS, RUNNING,
  PREEMPTED, FINISHED_*), num_computed_tokens, and the content keys vLLM
  hashes besides tokens: multimodal items (mm_features), a LoRA adapter, a
  cache salt.

Each TP rank's KV cache is one tensor per layer, of FlashAttention's shape
(2, num_blocks, block_size, heads, head_size) or MLA's single region per
block, in device memory (sim memory seen through numpy, DeviceMemory on a
GPU, or torch CUDA tensors: test_vllm_torch.py), written by a toy model
whose KV is a pure function of the token prefix, its extra keys, the layer,
K/V and the rank, so every block can be checked."""

import enum
import hashlib
import os
from types import SimpleNamespace

import numpy as np

import kvstrand


PICTURE = os.environ.get("KVSTRAND_VLLM_PICTURE", "newest")
NEWEST = PICTURE != "oldest"
BLOCK, HEADS, HEAD = 16, 2, 32
ELEM = 2  # bf16
NULL = 0


class Status(enum.Enum):
    WAITING = 1
    WAITING_FOR_REMOTE_KVS = 2
    RUNNING = 3
    PREEMPTED = 4
    FINISHED_STOPPED = 5
    FINISHED_ABORTED = 6
    FINISHED_ERROR = 7


FINISHED = {Status.FINISHED_STOPPED, Status.FINISHED_ABORTED, Status.FINISHED_ERROR}


# vLLM's KV-cache spec classes, by name (kvstrand.vllm reads the class name).
class AttentionSpec(SimpleNamespace):
    pass


class FullAttentionSpec(AttentionSpec):
    pass


class SlidingWindowSpec(AttentionSpec):
    pass


class MambaSpec(SimpleNamespace):
    pass


def model_state(req, end, group, layer, rank, size):
    """The toy model's recurrent state after the prefix [0, end): a function
    of the tokens, their extra keys, the group, the layer and the rank."""
    seed = hashlib.blake2b(np.asarray(req.all_token_ids[:end], dtype=np.uint32).tobytes() + req.extra_key(end) +
                           b"state" + bytes([group, layer, rank]), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(seed, "little")).integers(0, 256, size, dtype=np.uint8)


def kv_shape(planes, num_blocks):
    """A layer's KV cache tensor: FlashAttention's (2, num_blocks, block_size,
    heads, head_size), or one region per block (MLA's latent cache) for a
    single plane."""
    return (2, num_blocks, BLOCK, HEADS, HEAD) if planes == 2 else (num_blocks, BLOCK, 1, 2 * HEADS * HEAD)


def hybrid_strides():
    """vLLM's element strides for a Mamba hybrid's attention cache (2,
    num_blocks, block_size, heads, head_size): K and V of a block adjacent."""
    hidden = BLOCK * HEADS * HEAD
    return (hidden, 2 * hidden, HEADS * HEAD, HEAD, 1)


def kv_offset(planes, num_blocks, half, block):
    """Where a block's K (half 0) or V (half 1) bytes start in a layer's tensor."""
    half_bytes = BLOCK * HEADS * HEAD * ELEM
    return ((half * num_blocks + block) if planes == 2 else (2 * block + half)) * half_bytes


class FakeTensor:
    """What kvstrand.vllm reads of a torch.Tensor: data_ptr, shape, element_size,
    is_contiguous. Sim device memory seen through numpy, or on a GPU backend
    DeviceMemory read and written by copies. `write`/`read` take a block's K
    (half 0) or V (half 1) bytes."""

    def __init__(self, planes, num_blocks):
        self.shape = kv_shape(planes, num_blocks)
        self.planes, self.num_blocks = planes, num_blocks
        self.half_bytes = BLOCK * HEADS * HEAD * ELEM
        size = int(np.prod(self.shape)) * ELEM
        if kvstrand.sim.available():
            self.memory = kvstrand.sim.allocate(size)
            self.view = np.frombuffer(self.memory, dtype=np.uint8)
        else:
            self.memory = kvstrand.DeviceMemory(size)
            self.view = None

    def write(self, half, block, data):
        at = kv_offset(self.planes, self.num_blocks, half, block)
        if self.view is not None:
            self.view[at:at + self.half_bytes] = data
        else:
            self.memory.write(at, data)

    def read(self, half, block):
        at = kv_offset(self.planes, self.num_blocks, half, block)
        if self.view is not None:
            return self.view[at:at + self.half_bytes]
        return np.frombuffer(self.memory.read(at, self.half_bytes), dtype=np.uint8)

    def data_ptr(self):
        return self.memory.address

    def element_size(self):
        return ELEM

    def stride(self, dim):
        return int(np.prod(self.shape[dim + 1:]))

    def is_contiguous(self):
        return True


class HybridAttentionTensor(FakeTensor):
    """An attention layer's cache in a Mamba hybrid
    (GPUModelRunner._update_hybrid_attention_mamba_layout): the (2,
    num_blocks, block_size, heads, head_size) tensor re-strided with
    as_strided_ to strides (hidden, 2 * hidden, heads * head_size,
    head_size, 1), hidden = block_size * heads * head_size, so that a block's
    K and V are adjacent: not contiguous. In memory as one region per block."""

    def __init__(self, planes, num_blocks):
        super().__init__(1, num_blocks)
        self.shape = kv_shape(2, num_blocks)
        self.strides = hybrid_strides()

    def stride(self, dim):
        return self.strides[dim]

    def is_contiguous(self):
        return False


class FakeStateTensor:
    """A Mamba layer's state cache as kvstrand.vllm reads it: one page per
    block (vLLM's conv and SSM state views start at the page; the first is
    what register_kv_caches is given, in a list as vLLM gives it)."""

    def __init__(self, num_blocks, page):
        self.shape, self.page = (num_blocks, page), page
        if kvstrand.sim.available():
            self.memory = kvstrand.sim.allocate(num_blocks * page)
            self.view = np.frombuffer(self.memory, dtype=np.uint8)
        else:
            self.memory = kvstrand.DeviceMemory(num_blocks * page)
            self.view = None

    @property
    def tensor(self):
        return [self]

    def write(self, block, data):
        if self.view is not None:
            self.view[block * self.page:(block + 1) * self.page] = data
        else:
            self.memory.write(block * self.page, data)

    def read(self, block):
        if self.view is not None:
            return self.view[block * self.page:(block + 1) * self.page]
        return np.frombuffer(self.memory.read(block * self.page, self.page), dtype=np.uint8)

    def data_ptr(self):
        return self.memory.address

    def element_size(self):
        return 1

    def stride(self, dim):
        return self.page if dim == 0 else 1


class KVCacheBlocks:
    def __init__(self, per_group):
        self.per_group = [list(ids) for ids in per_group]

    def get_block_ids(self, allow_none=False):
        if allow_none and not any(self.per_group):
            return None
        return tuple(list(ids) for ids in self.per_group)


class Request:
    def __init__(self, req_id, prompt, max_tokens, mm=(), lora=None, salt=None):
        self.request_id = req_id
        self.prompt_token_ids = list(prompt)
        self.num_prompt_tokens = len(prompt)
        self.output_token_ids = []
        self.max_tokens = max_tokens
        self.status = Status.WAITING
        self.num_computed_tokens = 0
        self.num_external_computed_tokens = 0
        self.num_cached_tokens = -1
        self.num_preemptions = 0
        # (offset, length, hash): an image's placeholder tokens at [offset, offset+length)
        self.mm_features = [SimpleNamespace(identifier=h, mm_position=SimpleNamespace(offset=o, length=n))
                            for o, n, h in mm]
        self.lora_request = SimpleNamespace(lora_name=lora, lora_int_id=hash(lora) % 1000 + 1) if lora else None
        self.cache_salt = salt
        self.prompt_embeds = None
        self.loaded = None  # (begin, end) of its tier load, for the test's checks

    @property
    def all_token_ids(self):
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self):
        return self.num_prompt_tokens + len(self.output_token_ids)

    def is_finished(self):
        return self.status in FINISHED

    @property
    def block_hashes(self):
        """vLLM's Request.block_hashes: one per full block of its tokens."""
        return block_hashes(self, self.num_tokens // BLOCK)

    def extra_key(self, end):
        """What besides tokens decides the KV of the prefix [0, end): vLLM's
        block-hash extra keys."""
        mm = tuple((f.mm_position.offset, f.identifier) for f in self.mm_features if f.mm_position.offset < end)
        return repr((self.lora_request.lora_name if self.lora_request else None, self.cache_salt, mm)).encode()


def block_hashes(req, n):
    """vLLM's block hashes of the first n full blocks: chained, each over its
    tokens and the extra keys of its prefix."""
    out, prev = [], b""
    tokens = req.all_token_ids
    for i in range(n):
        end = (i + 1) * BLOCK
        prev = hashlib.blake2b(prev + np.asarray(tokens[i * BLOCK:end], dtype=np.uint32).tobytes() +
                               req.extra_key(end), digest_size=16).digest()
        out.append(prev)
    return out


def model_kv(req, end, group, layer, half, rank):
    seed = hashlib.blake2b(np.asarray(req.all_token_ids[:end], dtype=np.uint32).tobytes() + req.extra_key(end) +
                           bytes([group, layer, half, rank]), digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(seed, "little")).integers(0, 256, BLOCK * HEADS * HEAD * ELEM,
                                                                          dtype=np.uint8)


def token_for(req):
    """The toy model's next token: a function of the sequence."""
    return int(hashlib.blake2b(np.asarray(req.all_token_ids, dtype=np.uint32).tobytes(), digest_size=4)
               .hexdigest(), 16) % 30000


def configs(socket, tp, num_blocks, layers, chunk_tokens, groups=None, policy="recompute", spec_tokens=0,
            cache_dtype="auto", kv_events=False, mamba_cache_mode="align", pipeline_parallel_size=1,
            decode_context_parallel_size=1, prefill_context_parallel_size=1, revision=None, quantization=None,
            hash_block_size=None, **extra):
    """vLLM's config objects as kvstrand.vllm reads them. `groups`: a list of
    (kind, layers, window) per KV-cache group; default one full-attention
    group of `layers` layers."""
    page = 2 * BLOCK * HEADS * HEAD * ELEM
    groups = groups or [("full", layers, 0)]
    vllm_config = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector="KvstrandConnector", kv_role="kv_both", is_kv_producer=True,
                                           kv_load_failure_policy=policy,
                                           kv_connector_extra_config={"server_socket": socket,
                                                                      "chunk_tokens": chunk_tokens, **extra}),
        cache_config=SimpleNamespace(block_size=BLOCK, cache_dtype=cache_dtype, hash_block_size=hash_block_size),
        model_config=SimpleNamespace(model="toy/llama-mini", dtype="torch.bfloat16", revision=revision,
                                     quantization=quantization),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=pipeline_parallel_size,
                                        decode_context_parallel_size=decode_context_parallel_size,
                                        prefill_context_parallel_size=prefill_context_parallel_size),
        speculative_config=SimpleNamespace(num_speculative_tokens=spec_tokens, method="eagle") if spec_tokens
        else None,
        kv_events_config=SimpleNamespace(enable_kv_cache_events=kv_events))
    kv_groups, n = [], 0
    for kind, count, window in groups:
        names = [f"model.layers.{n + i}.{'mixer' if kind == 'mamba' else 'self_attn.attn'}" for i in range(count)]
        n += count
        spec = {"full": FullAttentionSpec, "sliding": SlidingWindowSpec, "mamba": MambaSpec}[kind](
            block_size=BLOCK, page_size_bytes=page, sliding_window=window or None)
        if kind == "mamba":
            spec.mamba_cache_mode = mamba_cache_mode
        kv_groups.append(SimpleNamespace(layer_names=names, kv_cache_spec=spec))
    kv_cache_config = SimpleNamespace(num_blocks=num_blocks, kv_cache_groups=kv_groups)
    return vllm_config, kv_cache_config


class ToyModelChecks:
    """What MiniVllm's forward pass writes and its checks compare: the toy
    model's KV and Mamba states in the caches' blocks (a mixin over
    MiniVllm's caches, block table and Mamba groups)."""

    def _block_kv(self, ranks, req, begin, end):
        """(tensor, half, block, the model's bytes, where) for every K and V of
        every full block of [begin, end) on `ranks`, the null block left out."""
        for block_end in range((begin // BLOCK + 1) * BLOCK, end + 1, BLOCK):
            i = block_end // BLOCK - 1
            for rank in ranks:
                for g, layers in enumerate(self.caches[rank]):
                    block = self.kv.blocks[req.request_id][g][i]
                    if block == NULL or g in self.mamba:
                        continue
                    for layer, t in enumerate(layers):
                        for half in (0, 1):
                            yield (t, half, block, model_kv(req, block_end, g, layer, half, rank),
                                   (req.request_id, i, block, rank, g, layer, half))

    def forward(self, rank, req, begin, end):
        """Writes the KV of every block that [begin, end) completes, and each
        Mamba layer's state: read from the block of token `begin` (checked:
        a wrong state would make every later token wrong), written to the
        block of token `end`."""
        for t, half, block, data, _ in self._block_kv([rank], req, begin, end):
            t.write(half, block, data)
        for g in self.mamba:
            ids = self.kv.blocks[req.request_id][g]
            cow = self.cow.get((req.request_id, g))
            target = cow[1] if cow is not None else ids[-(-end // BLOCK) - 1]
            for layer, t in enumerate(self.caches[rank][g]):
                if begin > 0:
                    self.stats["mismatches"] += self._state_differs(req, begin, g, layer, rank)
                t.write(target, model_state(req, end, g, layer, rank, t.page))

    def _state_differs(self, req, at, g, layer, rank):
        """Whether the state the block of token `at` holds is not the model's
        state after [0, at) (noted in self.mismatched)."""
        t = self.caches[rank][g][layer]
        block = self.kv.blocks[req.request_id][g][-(-at // BLOCK) - 1]
        if block != NULL and np.array_equal(t.read(block), model_state(req, at, g, layer, rank, t.page)):
            return 0
        self.mismatched.append((req.request_id, "state", at, block, rank, g, layer))
        return 1

    def check_state(self, req, at):
        """Mamba states at token `at` on every rank that differ from the model's."""
        return sum(self._state_differs(req, at, g, layer, rank)
                   for rank in range(self.tp) for g in self.mamba for layer in range(len(self.caches[rank][g])))

    def check(self, req, begin, end):
        """Blocks of [begin, end) (full ones, not null) that differ from the
        model's KV on any rank; each noted in self.mismatched (request,
        position, block, rank, group, layer, half)."""
        bad = [where for t, half, block, data, where in self._block_kv(range(self.tp), req, begin, end)
               if not np.array_equal(t.read(half, block), data)]
        self.mismatched.extend(bad)
        return len(bad)
