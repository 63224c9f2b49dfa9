"""The three places of vLLM's kv_cache_utils (main) that kvstrand.vllm reads
for its events: the grain of Request.block_hashes (several hashes a block
where a hybrid's groups are hashed finer than a block), the view of those
hashes a block at a time, and each block's extra keys. Written from vLLM's
source for the suite, not copied; maybe_convert_block_hash is left out, so
the events carry the hashes as the tests make them."""

import math


def resolve_kv_cache_block_sizes(kv_cache_config, vllm_config):
    """(scheduler block size, hash block size): one group hashes a block at
    a time; several, at cache_config.hash_block_size where it is set, else at
    the greatest common divisor of the groups' block sizes."""
    groups = kv_cache_config.kv_cache_groups
    block = int(vllm_config.cache_config.block_size)
    if len(groups) <= 1:
        return block, block
    sizes = [int(g.kv_cache_spec.block_size) for g in groups]
    grain = getattr(vllm_config.cache_config, "hash_block_size", None) or math.gcd(*sizes)
    return math.lcm(*sizes), int(grain)


class BlockHashListWithBlockSize:
    """Hashes at hash_block_size seen at target_block_size: each block's
    hash is the last of its sub-block hashes (it chains over the whole
    prefix)."""

    def __init__(self, block_hashes, hash_block_size, target_block_size):
        assert target_block_size % hash_block_size == 0
        self.block_hashes = block_hashes
        self.scale_factor = target_block_size // hash_block_size

    def __len__(self):
        return len(self.block_hashes) // self.scale_factor

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return [self[i] for i in range(*idx.indices(len(self)))]
        return self.block_hashes[(idx + 1) * self.scale_factor - 1]

    def __iter__(self):
        return (self[i] for i in range(len(self)))


def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
    """What a block's hash covers besides its tokens: the identifiers of the
    multimodal items that overlap it, the LoRA's name, and the cache salt
    (first block only). Returns (the keys or None, the item the next block
    starts looking at)."""
    keys = []
    items = getattr(request, "mm_features", None) or []
    idx = start_mm_idx
    while idx < len(items):
        pos = items[idx].mm_position
        if pos.offset >= end_token_idx:
            break
        if pos.offset + pos.length > start_token_idx:
            keys.append(items[idx].identifier)
        if pos.offset + pos.length > end_token_idx:
            break  # it goes on into the next block
        idx += 1
    lora = getattr(request, "lora_request", None)
    if lora is not None:
        keys.append(lora.lora_name)
    salt = getattr(request, "cache_salt", None)
    if start_token_idx == 0 and salt:
        keys.append(salt)
    return (tuple(keys) if keys else None), idx
