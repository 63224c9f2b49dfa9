"""kvstrand.vllm's configuration: vLLM's config plus
``kv_transfer_config.kv_connector_extra_config``, checked at start-up.

Extra config keys (a demanding default for each but the socket):

  server_socket        kvstrand-server's socket (required: the scheduler and the
                       workers are separate processes, so the tier is the node's)
  chunk_tokens         tokens per stored chunk (default 256; the server's
                       --chunk-tokens, a multiple of the block size)
  planes_per_layer     2: a layer's K and V are separate halves of its cache
                       tensor (FlashAttention's (2, num_blocks, ...)); 1: one
                       region per block (MLA, FlashInfer's (num_blocks, 2, ...))
  min_load_tokens      a tier hit shorter than this past the local hit is not
                       loaded (default 0)
  max_load_failures    loads of one request that may fail before it is offered
                       no more tier hits (default 2)
  transfer_deadline_s  every transfer's deadline; passing it is fail-stop (60)
  request_timeout_s    bound on each request to the server (10)
  server_uid           a kvstrand-server run by this uid is trusted too (default:
                       only this process's user and root: a server of another
                       user on the socket's path is refused, a miss)
  tenant_salt          isolates tenants' keys (default "")
  tenant               the tenant's name (not a secret; default ""): its own
                       keys, and what kvstrand-server's --tenant-quota and
                       per-tenant metrics name
  drop_on_reset        vLLM's reset_prefix_cache(reset_connector=True) also
                       drops this model's objects from the node tier, for
                       every engine there (default false: this engine alone
                       stops reading them)
  weight_version       the weights' version (an online weight update's, a
                       training step's): KV stored under another version is
                       never loaded (default "": the model's revision, in
                       its id, is all that names the weights)
  replicated_across_tp every TP rank holds the same KV (MLA): one copy stored
  tier_events          who announces the node tier's blocks to routers:
                       "engine" (default: this engine, in vLLM's own KV
                       events, medium CPU, what it stored itself) or
                       "server" (kvstrand-server --events, for every engine
                       on the node and every medium: each save sends its
                       chunks' vLLM block hashes along; this engine
                       announces none of the tier's blocks itself)
  load_path            how loads gather onto the GPU: "rule" (default: the
                       gather kernel, the copy engines for segments of 1
                       MiB or more), "measure" (the gather kernel and one
                       batched DMA call timed on the KV cache's segment
                       sizes at registration, each load takes the faster),
                       "kernel" or "dma-batch"

KV-cache groups: one kvstrand registration per attention group vLLM's
(hybrid) allocator presents, full attention and sliding window. Mamba /
linear-attention groups under --mamba-cache-mode align (vLLM keeps a state
per block boundary a step ends on) are served as checkpoints: their state
at a chunk end rides in the first full-attention group's object of that
chunk (its registration's state_parts, one per Mamba layer), the hit is
capped to a chunk end whose state is stored, and a load writes the state
into the block vLLM allocated for it. A group kvstrand cannot serve
correctly (Mamba state outside align mode, or under a vLLM whose scheduler
asserts no external KV for it; chunked local attention; cross attention) is
refused here, naming the group and the reason.
"""

import logging
import re
from dataclasses import dataclass, field

import kvstrand

from . import events, interface

log = logging.getLogger("kvstrand.vllm")

OPTION_PREFIX = "kv_connector_extra_config."
GROUPS_OPTION = "kv_cache_config.kv_cache_groups"


def config_error(option, message):
    e = kvstrand.ConfigError(f"invalid option '{option}': {message}")
    e.option = option
    return e


def spec_kind(spec):
    """'full' or 'sliding' for the attention specs kvstrand serves; otherwise
    the spec's class name. By class name along the MRO, so vLLM's classes and
    look-alikes (tests) are read the same way."""
    names = [c.__name__ for c in type(spec).__mro__]
    if "MambaSpec" in names:
        return "mamba"
    for refused in ("ChunkedLocalAttentionSpec", "CrossAttentionSpec", "EncoderOnlyAttentionSpec"):
        if refused in names:
            return refused
    # Only the classes whose blocks are known to be a function of their
    # prefix: a subclass kvstrand has not read (a sparse or sink attention
    # of a newer vLLM) is not taken for its base.
    if names[0] in ("SlidingWindowSpec", "SlidingWindowMLASpec"):
        return "sliding"
    if names[0] in ("FullAttentionSpec", "MLAAttentionSpec"):
        return "full"
    return names[0]


def vllm_spec_kind(spec):
    """vLLM's own name for a spec's kind (KVCacheSpecKind, what its
    BlockStored events carry as kv_cache_spec_kind), for the specs
    kvstrand serves: the most specific class first, as vLLM checks them."""
    names = [c.__name__ for c in type(spec).__mro__]
    for cls, kind in (("SlidingWindowMLASpec", "sliding_window_mla"), ("MLAAttentionSpec", "mla_attention"),
                      ("FullAttentionSpec", "full_attention"), ("SlidingWindowSpec", "sliding_window"),
                      ("MambaSpec", "mamba")):
        if cls in names:
            return kind
    return "unknown"


_REFUSAL = {
    "ChunkedLocalAttentionSpec": "chunked local attention hands out the null block inside the prompt; a chunk's KV "
                                 "is not a function of its prefix kvstrand could key",
    "CrossAttentionSpec": "encoder-decoder cross attention (vLLM refuses KV connectors for it too)",
    "EncoderOnlyAttentionSpec": "encoder-only attention keeps no KV cache",
}


def _vllm_scheduler_source(method):
    """The source of the installed vLLM's Scheduler.`method`, or None where
    vLLM is not importable or the method is not there (nothing to ask; a
    driver other than vLLM decides)."""
    try:
        import inspect  # noqa: PLC0415

        from vllm.v1.core.sched.scheduler import Scheduler  # type: ignore # noqa: PLC0415
    except ImportError:
        return None
    found = getattr(Scheduler, method, None)
    if found is None:
        return None
    try:
        return inspect.getsource(found)
    except (OSError, TypeError):
        return None


def vllm_reports_failures_per_request():
    """Whether the installed vLLM takes failed loads per request
    (KVConnectorTransferResults.failed_recving), the report its scheduler
    recovers from under several KV-cache groups."""
    return interface.VLLM_AVAILABLE and hasattr(interface.KVConnectorBase_V1, "get_transfer_results")


def vllm_recovers_hybrid_load_errors():
    """Whether the installed vLLM's scheduler can take load errors when it
    runs several KV-cache groups: True, False, or None (see above)."""
    if vllm_reports_failures_per_request():
        return True
    source = _vllm_scheduler_source("_update_requests_with_invalid_blocks")
    if source is None:
        return None
    # vLLM at 00024d3: "(req_block_ids,) = self.kv_cache_manager.get_block_ids(req_id)"
    # unpacks exactly one group and raises on more.
    return re.search(r"\(\s*req_block_ids\s*,\s*\)\s*=", source) is None


def vllm_loads_external_mamba_state():
    """Whether the installed vLLM's scheduler lets a connector load into a
    request with Mamba groups: False where
    Scheduler._mamba_block_aligned_split asserts num_external_computed_tokens
    == 0 (vLLM issue #39702, 'External KV connector is not verified yet';
    deployments patch it out), None where there is nothing to ask."""
    source = _vllm_scheduler_source("_mamba_block_aligned_split")
    if source is None:
        return None
    return re.search(r"assert\s+num_external_computed_tokens\s*==\s*0", source) is None


def model_identity(vllm_config):
    """What names the weights a KV cache was computed with: the model, and
    where set its revision and quantization (two engines of one model that
    differ in either compute different KV and must share no chunk), and the
    decode/prefill context-parallel sizes (how a rank's blocks are cut).
    Fields at their defaults add nothing, so keys stay those of earlier
    kvstrand.vllm versions for the plain case."""
    model = vllm_config.model_config
    parts = [str(model.model)]
    for key in ("revision", "quantization"):
        value = getattr(model, key, None)
        if value:
            parts.append(f"{key}={value}")
    parallel = vllm_config.parallel_config
    for key in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        value = int(getattr(parallel, key, 1) or 1)
        if value != 1:
            parts.append(f"{key}={value}")
    return ";".join(parts)


@dataclass
class LayerSpec:
    name: str
    page_size_bytes: int  # one block of this layer, every plane


@dataclass
class GroupSpec:
    kind: str              # "full", "sliding" or "mamba"
    sliding_window: int    # tokens; 0 for full attention
    layers: list
    index: int = 0         # vLLM's index of the group (its block ids' position)
    vllm_kind: str = ""    # vLLM's KVCacheSpecKind value (its events' kv_cache_spec_kind)


@dataclass
class ConnectorConfig:
    server_socket: str
    block_size: int
    chunk_tokens: int
    planes_per_layer: int
    min_load_tokens: int
    max_load_failures: int
    transfer_deadline_s: float
    request_timeout_s: float
    server_uid: int
    model_id: str
    dtype: str
    tenant_salt: str
    tenant: str
    tp_size: int
    weight_version: str
    drop_on_reset: bool
    replicated_across_tp: bool
    tier_events: str
    num_blocks: int
    load_path: str = "rule"
    groups: list = field(default_factory=list)        # attention groups: one registration each
    state_groups: list = field(default_factory=list)  # Mamba groups (align mode): checkpoints of groups[0]
    speculative_tokens: int = 0
    speculative_method: str = ""
    kv_events: bool = False  # vLLM publishes KV events (kv_events_config.enable_kv_cache_events)
    block_major: bool = False  # attention tensors are (2, num_blocks, ...) re-strided block by block (Mamba hybrids)
    # Tokens per hash of vLLM's Request.block_hashes: finer than block_size
    # where vLLM hashes at a finer grain (its hash_block_size); events view
    # them a block at a time, as vLLM's own do.
    hash_block_size: int = 0

    @property
    def layers(self):
        return [layer for g in self.groups for layer in g.layers]

    @classmethod
    def from_vllm(cls, vllm_config, kv_cache_config):
        transfer = vllm_config.kv_transfer_config
        extra = dict(getattr(transfer, "kv_connector_extra_config", None) or {})

        def get(key, default, kind):
            value = extra.pop(key, default)
            try:
                return kind(value)
            except (TypeError, ValueError):
                raise config_error(OPTION_PREFIX + key, f"{value!r} is not a {kind.__name__}") from None

        socket = get("server_socket", "", str)
        if not socket:
            raise config_error(OPTION_PREFIX + "server_socket",
                                "kvstrand.vllm needs kvstrand-server's socket: vLLM's scheduler and workers are "
                                "separate processes and share the node tier")
        # Both of vLLM's policies are served: "recompute" (a failed load is
        # computed instead) and "fail", vLLM's default (the request whose
        # load failed ends in an error; the engine goes on). kvstrand reports
        # a failed load the same way under either; vLLM decides.
        policy = str(getattr(transfer, "kv_load_failure_policy", "fail") or "fail")
        if policy not in ("recompute", "fail"):
            raise config_error("kv_transfer_config.kv_load_failure_policy",
                                f"{policy!r} is not one of vLLM's policies, \"recompute\" or \"fail\"")
        block_size = int(vllm_config.cache_config.block_size)
        chunk = get("chunk_tokens", 256, int)
        if chunk <= 0 or chunk % block_size:
            raise config_error(OPTION_PREFIX + "chunk_tokens",
                                f"{chunk} is not a positive multiple of the block size ({block_size})")
        planes = get("planes_per_layer", 2, int)
        if planes not in (1, 2):
            raise config_error(OPTION_PREFIX + "planes_per_layer", f"{planes} is not 1 or 2")
        groups, state_groups = [], []
        for i, group in enumerate(list(getattr(kv_cache_config, "kv_cache_groups", []) or [])):
            option = f"{GROUPS_OPTION}[{i}].kv_cache_spec"
            spec = group.kv_cache_spec
            if not getattr(group, "enable_kv_transfer", True):
                # vLLM marks it outside the transferable KV state (sparse
                # attention's indexer, say): neither saved nor loaded.
                log.info("kvstrand.vllm: KV-cache group %d (%s) is not transferable (enable_kv_transfer=False): "
                         "neither saved nor loaded", i, type(spec).__name__)
                continue
            kind = spec_kind(spec)
            if kind == "mamba":
                state_groups.append(_mamba_group(vllm_config, spec, group, i, option, block_size))
                continue
            if kind not in ("full", "sliding"):
                raise config_error(option, f"kvstrand.vllm cannot serve group {i}'s {kind}: "
                                           f"{_REFUSAL.get(kind, 'not an attention KV cache it knows')}")
            if int(spec.block_size) != block_size:
                raise config_error(option + ".block_size",
                                    f"{spec.block_size} differs from cache_config.block_size {block_size}")
            page = int(spec.page_size_bytes)
            if page % planes:
                raise config_error(OPTION_PREFIX + "planes_per_layer",
                                    f"a block of {page} bytes does not split in {planes}")
            window = int(getattr(spec, "sliding_window", 0) or 0) if kind == "sliding" else 0
            groups.append(GroupSpec(kind, window, [LayerSpec(n, page) for n in group.layer_names], i,
                                    vllm_spec_kind(spec)))
        if not groups:
            raise config_error(GROUPS_OPTION, "no KV-cache group to serve")
        # With Mamba groups vLLM lays each attention layer's cache out block by
        # block (GPUModelRunner._update_hybrid_attention_mamba_layout re-strides
        # its (2, num_blocks, ...) tensor so a block's K and V are adjacent, to
        # share pages with the Mamba state): one region per block, whatever
        # planes_per_layer says of the unhybrid layout.
        block_major = bool(state_groups)  # planes_per_layer 1 or 2: was taken as contiguous for 1
        if block_major:
            planes = 1
        if state_groups and groups[0].kind != "full":
            raise config_error(GROUPS_OPTION, "Mamba groups need a full-attention group to carry their checkpoints "
                                              "(the first attention group is a sliding window here)")
        if len(groups) + len(state_groups) > 1 and vllm_recovers_hybrid_load_errors() is False:
            raise config_error(GROUPS_OPTION,
                                f"{len(groups) + len(state_groups)} groups, and this vLLM cannot recover a failed KV load under its hybrid "
                                "allocator (Scheduler._update_requests_with_invalid_blocks reads one group's blocks): a "
                                "load lost with a restarted kvstrand-server would stop the engine. Serve one group "
                                "(--disable-hybrid-kv-cache-manager) or use a vLLM whose scheduler handles every group")
        parallel = vllm_config.parallel_config
        for key, what in (("pipeline_parallel_size", "later pipeline stages register other layers under the "
                                                      "same keys, and kvstrand.vllm serves one stage's layers"),
                          ("decode_context_parallel_size", "each rank holds an interleaved share of a block's "
                                                            "tokens, a layout kvstrand.vllm is not verified with"),
                          ("prefill_context_parallel_size", "each rank holds an interleaved share of a block's "
                                                             "tokens, a layout kvstrand.vllm is not verified with")):
            size = int(getattr(parallel, key, 1) or 1)
            if size > 1:
                raise config_error(f"parallel_config.{key}", f"{size}: not served ({what}); run with 1")
        kv_events = bool(getattr(getattr(vllm_config, "kv_events_config", None), "enable_kv_cache_events", False))
        if kv_events and events.EVENTS_UNAVAILABLE:
            log.warning("kvstrand.vllm: KV events off: this vLLM's event types are not the ones kvstrand knows "
                        "(%s); serving goes on without them", events.EVENTS_UNAVAILABLE)
            kv_events = False
        model = vllm_config.model_config
        # The cache's dtype, not the model's: fp8_e4m3 and fp8_e5m2 caches of one
        # bf16 model hold different bytes.
        cache_dtype = str(getattr(vllm_config.cache_config, "cache_dtype", "auto") or "auto")
        spec_cfg = getattr(vllm_config, "speculative_config", None)
        cfg = cls(
            server_socket=socket,
            block_size=block_size,
            chunk_tokens=chunk,
            planes_per_layer=planes,
            block_major=block_major,
            min_load_tokens=get("min_load_tokens", 0, int),
            max_load_failures=get("max_load_failures", 2, int),
            transfer_deadline_s=get("transfer_deadline_s", 60.0, float),
            request_timeout_s=get("request_timeout_s", 10.0, float),
            server_uid=get("server_uid", -1, int),
            model_id=model_identity(vllm_config),
            dtype=str(model.dtype) if cache_dtype == "auto" else cache_dtype,
            tenant_salt=get("tenant_salt", "", str),
            tenant=get("tenant", "", str),
            tp_size=int(vllm_config.parallel_config.tensor_parallel_size),
            weight_version=get("weight_version", "", str),
            drop_on_reset=get("drop_on_reset", False, bool),
            replicated_across_tp=get("replicated_across_tp", False, bool),
            tier_events=get("tier_events", "engine", str),
            load_path=get("load_path", "rule", str),
            num_blocks=int(getattr(kv_cache_config, "num_blocks", 0)),
            groups=groups,
            state_groups=state_groups,
            speculative_tokens=int(getattr(spec_cfg, "num_speculative_tokens", 0) or 0) if spec_cfg else 0,
            speculative_method=str(getattr(spec_cfg, "method", "") or "") if spec_cfg else "",
            kv_events=kv_events,
            hash_block_size=_hash_block_size(vllm_config, kv_cache_config, block_size),
        )
        if (why := kvstrand.tenant_problem(cfg.tenant)) is not None:
            raise config_error(OPTION_PREFIX + "tenant", why)
        if cfg.tier_events not in ("engine", "server"):
            raise config_error(OPTION_PREFIX + "tier_events", f"{cfg.tier_events!r} is not \"engine\" or \"server\"")
        if cfg.load_path not in ("rule", "measure", "kernel", "dma-batch"):
            raise config_error(OPTION_PREFIX + "load_path",
                               f"{cfg.load_path!r} is not \"rule\", \"measure\", \"kernel\" or \"dma-batch\"")
        if cfg.max_load_failures < 0:
            raise config_error(OPTION_PREFIX + "max_load_failures", f"{cfg.max_load_failures} is negative")
        if extra:
            key = sorted(extra)[0]
            raise config_error(OPTION_PREFIX + key, "kvstrand.vllm has no such option")
        return cfg

    def layout(self, tp_rank, group=0):
        """Group `group`'s layout on `tp_rank`: one plane per layer and K/V
        half, in the layers' order, so the scheduler (which has no tensors)
        and each worker compute the same namespace. A sliding-window group's
        window is part of its namespace."""
        g = self.groups[group]
        suffixes = ("k", "v") if self.planes_per_layer == 2 else ("kv",)
        planes = [kvstrand.Plane(f"{layer.name}.{s}", layer.page_size_bytes // self.planes_per_layer)
                  for layer in g.layers for s in suffixes]
        return kvstrand.Layout(
            model_id=self.model_id, layout_name=f"vllm-paged-{self.planes_per_layer}", planes=planes,
            block_tokens=self.block_size, chunk_tokens=self.chunk_tokens, sliding_window=g.sliding_window,
            dtype=self.dtype, tenant_salt=self.tenant_salt, tp_size=self.tp_size, tp_rank=tp_rank,
            replicated_across_tp=self.replicated_across_tp, weight_version=self.weight_version, tenant=self.tenant,
            speculative=kvstrand.SpeculativeConfig(self.speculative_method, self.speculative_tokens),
            checkpoint=self.checkpoint() if group == 0 else kvstrand.CheckpointSpec())

    @property
    def state_layers(self):
        return [layer for g in self.state_groups for layer in g.layers]

    def checkpoint(self):
        """The Mamba groups' state at a chunk end, carried by group 0: one
        block of every Mamba layer (its whole page, conv and SSM state), in
        the groups' order. None without Mamba groups."""
        image = sum(layer.page_size_bytes for layer in self.state_layers)
        if not image:
            return kvstrand.CheckpointSpec()
        return kvstrand.CheckpointSpec("vllm-mamba-align", image, self.chunk_tokens)

    def connector_options(self):
        o = kvstrand.ConnectorOptions(server_socket=self.server_socket, transfer_deadline=self.transfer_deadline_s,
                                      server_request_timeout=self.request_timeout_s, load_path=self.load_path)
        o.server_uid = self.server_uid
        return o


def _hash_block_size(vllm_config, kv_cache_config, block_size):
    """The grain of vLLM's Request.block_hashes, as vLLM resolves it
    (resolve_kv_cache_block_sizes: a hybrid's groups may be hashed finer
    than a block); the block size where this vLLM has no such grain."""
    from .events import vllm_helper
    resolve = vllm_helper("resolve_kv_cache_block_sizes")
    if resolve is None:
        return block_size
    try:
        grain = int(resolve(kv_cache_config, vllm_config)[1])
    except Exception as e:  # noqa: BLE001 - vLLM's own check of its config: vLLM refuses it itself
        log.warning("kvstrand.vllm: vLLM's resolve_kv_cache_block_sizes failed (%s): events take one hash a block", e)
        return block_size
    if grain <= 0 or block_size % grain:
        raise config_error("cache_config.hash_block_size", f"{grain} does not divide the block size {block_size}")
    return grain


def _mamba_group(vllm_config, spec, group, index, option, block_size):
    """A Mamba group as kvstrand serves it (align mode, a vLLM that loads
    external state), or a ConfigError naming why not."""
    mode = str(getattr(spec, "mamba_cache_mode", None) or
               getattr(vllm_config.cache_config, "mamba_cache_mode", None) or "none")
    if mode != "align":
        raise config_error(option, f"kvstrand.vllm cannot serve a Mamba group under mamba_cache_mode {mode!r}: only "
                                   "'align' (--enable-prefix-caching --mamba-cache-mode align) keeps a state at the "
                                   "block boundaries a step ends on, which is what a chunk's checkpoint needs")
    if vllm_loads_external_mamba_state() is False:
        raise config_error(option, "kvstrand.vllm cannot serve a Mamba group under this vLLM: its scheduler asserts "
                                   "that no external KV is loaded for it (Scheduler._mamba_block_aligned_split, "
                                   "'External KV connector is not verified yet', vLLM issue #39702). Use a vLLM "
                                   "without that assert (the function already counts external tokens)")
    if int(spec.block_size) != block_size:
        raise config_error(option + ".block_size", f"{spec.block_size} differs from cache_config.block_size {block_size}")
    page = int(spec.page_size_bytes)
    if page <= 0:
        raise config_error(option + ".page_size_bytes", f"{page} is not a page size")
    return GroupSpec("mamba", 0, [LayerSpec(n, page) for n in group.layer_names], index)
