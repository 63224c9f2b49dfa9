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
  transfer_deadline_s  every transfer's deadline; passing it is fail-stop (60)
  request_timeout_s    bound on each request to the server (10)
  tenant_salt          isolates tenants' keys (default "")
  replicated_across_tp every TP rank holds the same KV (MLA): one copy stored
"""

from dataclasses import dataclass, field

import kvstrand

OPTION_PREFIX = "kv_connector_extra_config."


def config_error(option, message):
    e = kvstrand.ConfigError(f"invalid option '{option}': {message}")
    e.option = option
    return e


@dataclass
class LayerSpec:
    name: str
    page_size_bytes: int  # one block of this layer, every plane


@dataclass
class ConnectorConfig:
    server_socket: str
    block_size: int
    chunk_tokens: int
    planes_per_layer: int
    min_load_tokens: int
    transfer_deadline_s: float
    request_timeout_s: float
    model_id: str
    dtype: str
    tenant_salt: str
    tp_size: int
    replicated_across_tp: bool
    num_blocks: int
    layers: list = field(default_factory=list)
    speculative_tokens: int = 0
    speculative_method: str = ""

    @classmethod
    def from_vllm(cls, vllm_config, kv_cache_config):
        extra = dict(getattr(vllm_config.kv_transfer_config, "kv_connector_extra_config", None) or {})

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
        block_size = int(vllm_config.cache_config.block_size)
        chunk = get("chunk_tokens", 256, int)
        if chunk <= 0 or chunk % block_size:
            raise config_error(OPTION_PREFIX + "chunk_tokens",
                                f"{chunk} is not a positive multiple of the block size ({block_size})")
        planes = get("planes_per_layer", 2, int)
        if planes not in (1, 2):
            raise config_error(OPTION_PREFIX + "planes_per_layer", f"{planes} is not 1 or 2")
        groups = list(getattr(kv_cache_config, "kv_cache_groups", []) or [])
        if len(groups) != 1:
            raise config_error("kv_cache_config.kv_cache_groups",
                                f"kvstrand.vllm serves models with one KV-cache group; this one has {len(groups)} "
                                "(the C++ API registers several: register_layout per group, plan_groups)")
        spec = groups[0].kv_cache_spec
        if int(spec.block_size) != block_size:
            raise config_error("kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size",
                                f"{spec.block_size} differs from cache_config.block_size {block_size}")
        page = int(spec.page_size_bytes)
        if page % planes:
            raise config_error(OPTION_PREFIX + "planes_per_layer", f"a block of {page} bytes does not split in {planes}")
        model = vllm_config.model_config
        spec_cfg = getattr(vllm_config, "speculative_config", None)
        cfg = cls(
            server_socket=socket,
            block_size=block_size,
            chunk_tokens=chunk,
            planes_per_layer=planes,
            min_load_tokens=get("min_load_tokens", 0, int),
            transfer_deadline_s=get("transfer_deadline_s", 60.0, float),
            request_timeout_s=get("request_timeout_s", 10.0, float),
            model_id=str(model.model),
            dtype=str(model.dtype),
            tenant_salt=get("tenant_salt", "", str),
            tp_size=int(vllm_config.parallel_config.tensor_parallel_size),
            replicated_across_tp=get("replicated_across_tp", False, bool),
            num_blocks=int(getattr(kv_cache_config, "num_blocks", 0)),
            layers=[LayerSpec(n, page) for n in groups[0].layer_names],
            speculative_tokens=int(getattr(spec_cfg, "num_speculative_tokens", 0) or 0) if spec_cfg else 0,
            speculative_method=str(getattr(spec_cfg, "method", "") or "") if spec_cfg else "",
        )
        if extra:
            key = sorted(extra)[0]
            raise config_error(OPTION_PREFIX + key, "kvstrand.vllm has no such option")
        return cfg

    def layout(self, tp_rank):
        """This model's layout on `tp_rank`: one plane per layer and K/V half,
        in the layers' order, so the scheduler (which has no tensors) and each
        worker compute the same namespace."""
        suffixes = ("k", "v") if self.planes_per_layer == 2 else ("kv",)
        planes = [kvstrand.Plane(f"{layer.name}.{s}", layer.page_size_bytes // self.planes_per_layer)
                  for layer in self.layers for s in suffixes]
        return kvstrand.Layout(
            model_id=self.model_id, layout_name=f"vllm-paged-{self.planes_per_layer}", planes=planes,
            block_tokens=self.block_size, chunk_tokens=self.chunk_tokens, dtype=self.dtype,
            tenant_salt=self.tenant_salt, tp_size=self.tp_size, tp_rank=tp_rank,
            replicated_across_tp=self.replicated_across_tp,
            speculative=kvstrand.SpeculativeConfig(self.speculative_method, self.speculative_tokens))

    def connector_options(self):
        return kvstrand.ConnectorOptions(server_socket=self.server_socket, transfer_deadline=self.transfer_deadline_s,
                                         server_request_timeout=self.request_timeout_s)
