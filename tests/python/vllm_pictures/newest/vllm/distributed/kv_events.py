"""vLLM's KV event types as a connector makes them (kv_events.py): the
fields kvstrand.vllm fills, in vLLM's order, and the container a worker's
connector events travel in to the scheduler. The same at v0.18 as far as
kvstrand uses them: the oldest picture links to this file (but for
kv_cache_spec_kind and kv_cache_spec_sliding_window, read at 00f4240;
kvstrand.vllm fills only the fields the installed class declares)."""

from dataclasses import dataclass


@dataclass(frozen=True)
class BlockStored:
    block_hashes: list
    parent_block_hash: object
    token_ids: list
    block_size: int
    lora_id: object
    medium: object
    lora_name: object = None
    extra_keys: object = None
    group_idx: object = None
    kv_cache_spec_kind: object = None  # KVCacheSpecKind's value: "full_attention", "sliding_window", ...
    kv_cache_spec_sliding_window: object = None


@dataclass(frozen=True)
class BlockRemoved:
    block_hashes: list
    medium: object
    group_idx: object = None


class KVConnectorKVEvents:
    def add_events(self, events):
        raise NotImplementedError

    def get_all_events(self):
        raise NotImplementedError
