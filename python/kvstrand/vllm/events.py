"""KV events for prefix-aware routers: what the node tier holds of this
engine's requests, in vLLM's own event types (vllm/distributed/kv_events.py:
BlockStored, BlockRemoved), published by vLLM's scheduler with its own
(KVEventBatch over ZMQ) when kv_events_config.enable_kv_cache_events is set.

How an event comes to be (vLLM's path for connector events):
- The scheduler numbers each save it hands the workers (SaveJob.save_id) and
  remembers, per KV-cache group, the vLLM block hashes of its blocks.
- Each worker reports every save's end per group, committed or not
  (get_kv_connector_kv_cache_events -> KVConnectorOutput.kv_cache_events,
  merged across workers by vLLM's KVOutputAggregator).
- A group's blocks are announced stored (medium "CPU") once every TP rank
  that writes to the tier committed them, whatever step each did it in; a
  save any rank failed or dropped is never announced.
- The node tier is shared and evicts without telling anyone, so removal is
  announced when it is learnt: a lookup that finds a shorter prefix than
  chunks announced before (those chunks can no longer be loaded as a
  prefix), and reset_cache (this engine stops reading all it stored).

Block hashes are vLLM's (Request.block_hashes, converted as vLLM converts
its own for events), so a router matches tier blocks against the same keys
as HBM blocks. Memory is bounded: at most MAX_PENDING saves awaited and
MAX_ANNOUNCED chunks remembered for removal (the oldest are forgotten).
"""

import dataclasses
import logging
from collections import OrderedDict

MEDIUM = "CPU"  # vLLM's name for host memory in its offloading connector's events
MAX_PENDING = 4096
MAX_ANNOUNCED = 1 << 16

from .interface import VLLM_AVAILABLE

log = logging.getLogger("kvstrand.vllm")

# Why this vLLM's event types cannot be used (None: they can, or vLLM is not
# installed and the local copies below stand in). KV events are optional:
# the connector then runs without them (config.py says so once).
EVENTS_UNAVAILABLE = None
try:
    from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVConnectorKVEvents  # type: ignore
except ImportError as e:
    if VLLM_AVAILABLE:
        EVENTS_UNAVAILABLE = f"vllm.distributed.kv_events: {type(e).__name__}: {e}"
    @dataclasses.dataclass(frozen=True)
    class BlockStored:
        """vLLM's BlockStored, its fields and their order."""

        block_hashes: list
        parent_block_hash: object
        token_ids: list
        block_size: int
        lora_id: object
        medium: object
        lora_name: object = None
        extra_keys: object = None
        group_idx: object = None

    @dataclasses.dataclass(frozen=True)
    class BlockRemoved:
        block_hashes: list
        medium: object
        group_idx: object = None

    class KVConnectorKVEvents:
        """vLLM's container of a connector's events from workers to the
        scheduler (what KVOutputAggregator merges)."""

        def merge(self, other):
            self.add_events(other.get_all_events())
            return self

# vLLM's KV-cache helpers live in vllm.v1.core.kv_cache_utils; a release
# may move KV-cache planning to kv_cache_planning. Looked up in both, so a
# move is a warning naming what is missing, not an ImportError.
_HELPER_MODULES = ("vllm.v1.core.kv_cache_utils", "vllm.v1.core.kv_cache_planning")


def vllm_helper(name):
    """vLLM's `name` from whichever of its KV-cache modules has it; None
    where none does (an older vLLM, or none installed)."""
    import importlib
    for module in _HELPER_MODULES:
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if found is not None:
            return found
    return None


_convert = vllm_helper("maybe_convert_block_hash")
if _convert is None and VLLM_AVAILABLE:
    log.warning("kvstrand.vllm: this vLLM has no maybe_convert_block_hash in %s: KV events carry its block "
                "hashes as they are (vLLM emits them as 64-bit ints by default)", " or ".join(_HELPER_MODULES))


def maybe_convert_block_hash(block_hash):
    """A block hash as vLLM's own events carry it (an int by default)."""
    return block_hash if _convert is None else _convert(block_hash)


def extra_keys_by_block(request, begin, end, block_size):
    """vLLM's extra keys of each block of [begin, end) of `request` (its
    multimodal items, LoRA, cache salt), as its own BlockStored carries
    them: vLLM's generate_block_hash_extra_keys walked from the prompt's
    start (it tracks the multimodal item it is at). None where this vLLM
    has no such function, or it fails on this request."""
    generate = vllm_helper("generate_block_hash_extra_keys")
    if generate is None:
        return None
    out, item = [], 0
    try:
        for start in range(0, end, block_size):
            keys, item = generate(request, start, start + block_size, item)
            if start >= begin:
                out.append(keys)
    except Exception as e:  # noqa: BLE001 - a request vLLM's function cannot read: the events go without
        log.debug("kvstrand.vllm: no extra keys for a request's events: %s", e)
        return None
    return out


def hashes_by_block(hashes, hash_block_size, block_size):
    """vLLM's hashes of a request's `block_size` blocks, from its
    Request.block_hashes (one per `hash_block_size` tokens, several a block
    where that is finer), as its own BlockStored carries them: through
    vLLM's BlockHashListWithBlockSize, so that each release's rule holds
    (the block's last sub-hash, or the sub-hashes joined in earlier ones);
    the last sub-hash where that class is missing."""
    hashes = list(hashes)
    if not hash_block_size or hash_block_size == block_size:
        return hashes
    if block_size % hash_block_size:
        return []  # vLLM refuses such sizes: nothing to announce
    view = vllm_helper("BlockHashListWithBlockSize")
    if view is not None:
        return list(view(hashes, hash_block_size, block_size))
    ratio = block_size // hash_block_size
    return [hashes[(i + 1) * ratio - 1] for i in range(len(hashes) // ratio)]


try:  # vLLM's own encoder (vLLM depends on msgspec); the one below otherwise
    from msgspec.msgpack import encode as _msgpack  # type: ignore
except ImportError:  # pragma: no cover - msgspec is there wherever vLLM is
    _msgpack = None


def _pack(value, out):
    """MessagePack of None, bool, int, bytes, str, list, tuple, dict: what a
    chunk's description holds."""
    import struct
    if value is None:
        out += b"\xc0"
    elif isinstance(value, bool):
        out += b"\xc3" if value else b"\xc2"
    elif isinstance(value, int):
        if 0 <= value < 128:
            out.append(value)
        elif -32 <= value < 0:
            out += struct.pack(">b", value)
        elif value >= 0:
            out += b"\xcf" + struct.pack(">Q", value)
        else:
            out += b"\xd3" + struct.pack(">q", value)
    elif isinstance(value, (bytes, bytearray)):
        out += b"\xc6" + struct.pack(">I", len(value)) + bytes(value)
    elif isinstance(value, str):
        b = value.encode()
        out += b"\xdb" + struct.pack(">I", len(b)) + b
    elif isinstance(value, (list, tuple)):
        out += b"\xdd" + struct.pack(">I", len(value))
        for v in value:
            _pack(v, out)
    elif isinstance(value, dict):
        out += b"\xdf" + struct.pack(">I", len(value))
        for k, v in value.items():
            _pack(k, out)
            _pack(v, out)
    else:
        raise TypeError(f"cannot describe a {type(value).__name__} in a KV event")
    return out


def encode(value):
    return _msgpack(value) if _msgpack is not None else bytes(_pack(value, bytearray()))


def spec_fields(group):
    """kv_cache_spec_kind and kv_cache_spec_sliding_window as vLLM fills
    them for a group's blocks (kvstrand.vllm.config.GroupSpec)."""
    return {"kv_cache_spec_kind": group.vllm_kind or None,
            "kv_cache_spec_sliding_window": group.sliding_window or None}


def describe_chunks(request, begin, end, block_size, chunk_tokens, group_idx, spec=None, hash_block_size=None):
    """Per chunk of [begin, end) (chunk-aligned) of `request` (vLLM's), what
    kvstrand-server announces of it in its KV events (docs/events.md): a
    msgpack map of BlockStored's fields as vLLM fills them for this
    request's blocks. None at all when vLLM did not hash its blocks
    (prefix caching off): then nothing is announced."""
    bs = block_size
    hashes = hashes_by_block(getattr(request, "block_hashes", None) or [], hash_block_size, bs)
    if len(hashes) < end // bs:
        return []
    lora = getattr(request, "lora_request", None)
    lora_id = getattr(lora, "lora_int_id", None) if lora is not None else None
    lora_name = getattr(lora, "lora_name", None) if lora is not None else None
    tokens = request.prompt_token_ids
    out = []
    for c in range(begin, end, chunk_tokens):
        first, last = c // bs, min(c + chunk_tokens, end) // bs
        out.append(encode({
            "block_hashes": [maybe_convert_block_hash(h) for h in hashes[first:last]],
            "parent_block_hash": maybe_convert_block_hash(hashes[first - 1]) if first else None,
            "token_ids": list(tokens[c:min(c + chunk_tokens, end)]), "block_size": bs,
            "extra_keys": extra_keys_by_block(request, c, min(c + chunk_tokens, end), bs),
            "lora_id": lora_id, "lora_name": lora_name, "group_idx": group_idx, **(spec or {})}))
    return out


def _event(cls, **fields):
    """cls(**fields) without the fields this vLLM's class lacks (older
    releases have no lora_name, extra_keys or group_idx)."""
    declared = getattr(cls, "__struct_fields__", None)
    if declared is None and dataclasses.is_dataclass(cls):
        declared = [f.name for f in dataclasses.fields(cls)]
    if declared is not None:
        fields = {k: v for k, v in fields.items() if k in declared}
    return cls(**fields)


@dataclasses.dataclass(frozen=True)
class SaveEnded:
    """One worker's word on one group of one save."""

    save_id: int
    group: int
    rank: int
    committed: bool


class KvstrandKVEvents(KVConnectorKVEvents):
    """Workers' SaveEnded records on their way to the scheduler. vLLM merges
    the workers' containers; the scheduler tallies ranks itself (a rank may
    report a save a step after another), so no count is kept here beyond
    the one vLLM's aggregator asks for."""

    def __init__(self, records=(), workers=1):
        self.records = list(records)
        self.workers = workers

    def add_events(self, events):
        self.records.extend(events)

    def aggregate(self):
        return self

    def increment_workers(self, count=1):
        self.workers += count

    def get_all_events(self):
        return list(self.records)

    def get_number_of_workers(self):
        return self.workers

    def clear_events(self):
        self.records = []


class _Pending:
    def __init__(self, stored, writers):
        self.stored = stored        # the BlockStored to publish
        self.waiting = set(writers)  # ranks yet to commit
        self.chunks = []            # (group, chunk hash) it covers, remembered for removal


class EventLog:
    """The scheduler side's record: saves awaited, chunks announced, events
    not yet taken by vLLM."""

    def __init__(self, writers, block_size, group_index=None, group_specs=None, hash_block_size=None):
        self.writers = list(writers)  # TP ranks whose saves reach the tier
        self.block_size = block_size
        self.hash_block_size = hash_block_size  # of vLLM's Request.block_hashes (None: the block size)
        # kvstrand's group -> vLLM's index of it (KV-cache groups vLLM
        # numbers include Mamba groups, which kvstrand does not register):
        # events name vLLM's, the number a router knows the blocks by.
        self.group_index = list(group_index) if group_index is not None else None
        # kvstrand's group -> its kv_cache_spec_kind and sliding window fields.
        self.group_specs = [spec_fields(g) for g in group_specs] if group_specs is not None else None
        self.pending = OrderedDict()   # (save_id, group) -> _Pending
        self.announced = OrderedDict()  # (group, chunk hash) -> converted block hashes
        self.out = []

    def _vllm(self, group):
        return group if self.group_index is None else self.group_index[group]

    def save_posted(self, save_id, group, request, begin, end, chunk_hashes):
        """Blocks [begin, end) of `request` (vLLM's) go to the tier under
        `chunk_hashes`; nothing to announce when vLLM did not hash them
        (prefix caching off)."""
        bs = self.block_size
        hashes = hashes_by_block(getattr(request, "block_hashes", None) or [], self.hash_block_size, bs)
        if len(hashes) < end // bs:
            return
        lora = getattr(request, "lora_request", None)
        stored = _event(
            BlockStored, block_hashes=[maybe_convert_block_hash(h) for h in hashes[begin // bs:end // bs]],
            parent_block_hash=maybe_convert_block_hash(hashes[begin // bs - 1]) if begin else None,
            token_ids=list(request.prompt_token_ids[begin:end]), block_size=bs,
            extra_keys=extra_keys_by_block(request, begin, end, bs),
            lora_id=getattr(lora, "lora_int_id", None) if lora is not None else None, medium=MEDIUM,
            lora_name=getattr(lora, "lora_name", None) if lora is not None else None, group_idx=self._vllm(group),
            **(self.group_specs[group] if self.group_specs is not None else {}))
        p = _Pending(stored, self.writers)
        p.chunks = [(group, h) for h in chunk_hashes]
        self.pending[(save_id, group)] = p
        while len(self.pending) > MAX_PENDING:  # a worker that never answers: forget the oldest
            self.pending.popitem(last=False)

    def save_ended(self, record):
        p = self.pending.get((record.save_id, record.group))
        if p is None:
            return
        if not record.committed:
            del self.pending[(record.save_id, record.group)]
            return
        p.waiting.discard(record.rank)
        if p.waiting:
            return
        del self.pending[(record.save_id, record.group)]
        self.out.append(p.stored)
        per_chunk = len(p.stored.block_hashes) // max(1, len(p.chunks))
        for i, chunk in enumerate(p.chunks):
            self.announced[chunk] = p.stored.block_hashes[i * per_chunk:(i + 1) * per_chunk]
            self.announced.move_to_end(chunk)
        while len(self.announced) > MAX_ANNOUNCED:
            self.announced.popitem(last=False)

    def prefix_found(self, group, chunk_hashes, held_chunks):
        """A lookup of `chunk_hashes` found the first `held_chunks` of them:
        the announced ones after those cannot be loaded as a prefix now."""
        gone = []
        for h in chunk_hashes[held_chunks:]:
            blocks = self.announced.pop((group, h), None)
            if blocks:
                gone.extend(blocks)
        if gone:
            self.out.append(_event(BlockRemoved, block_hashes=gone, medium=MEDIUM, group_idx=self._vllm(group)))

    def forget_all(self):
        """reset_cache: nothing stored before is read again."""
        by_group = {}
        for (group, _), blocks in self.announced.items():
            by_group.setdefault(group, []).extend(blocks)
        for group, blocks in sorted(by_group.items()):
            self.out.append(_event(BlockRemoved, block_hashes=blocks, medium=MEDIUM, group_idx=self._vllm(group)))
        self.announced.clear()
        self.pending.clear()

    def take(self):
        out, self.out = self.out, []
        return out
