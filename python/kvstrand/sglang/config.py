"""kvstrand.sglang's options: SGLang's HiCacheStorageConfig (read by field
name: their order differs between SGLang commits) and the backend's
``--hicache-storage-backend-extra-config``, checked at construction.

Extra config keys (a demanding default for each but the socket):

  server_socket      kvstrand-server's socket (required)
  tenant             the tenant's name (default ""): its keys, its quota
                     (--tenant-quota) and, with a server that binds tenants
                     to users, the one this process's user maps to
  tenant_salt        isolates tenants' keys (default "")
  weight_version     the weights' version: KV stored under another is never
                     read (default "": the model name is all that names them)
  model_revision     the checkpoint's revision, in the model's identity
                     (default "")
  request_timeout_s  bound on each request to the server (5)
  lease_bound_s      how long a hit batch_exists counted waits for its get (30)
  copy_threads       threads beside the caller's that copy a batch (3)
  server_uid         a server run by this uid is trusted too (default: only
                     this process's user and root)
  public_tenant      a tenant that publishes prefixes (kvstrand-server
                     --public-tenant; its engines use no tenant_salt): its
                     KV pages are read before this engine's own, through
                     memory the server hands over read-only, and not stored
                     again under this engine's tenant (default "": none)

SGLang's own keys (backend_name, module_path, class_name, interface_v1,
and a few other backends' that one config may carry) are accepted and
ignored; any other key is refused, naming it.
"""

from dataclasses import dataclass

import kvstrand

OPTION_PREFIX = "hicache-storage-backend-extra-config."

# Keys SGLang itself reads from the same dict.
SGLANG_KEYS = {"backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size"}
OWN_KEYS = {"server_socket", "tenant", "tenant_salt", "weight_version", "model_revision", "request_timeout_s",
            "lease_bound_s", "copy_threads", "server_uid", "public_tenant"}


def config_error(option, message):
    e = kvstrand.ConfigError(f"invalid option '{OPTION_PREFIX}{option}': {message}")
    e.option = OPTION_PREFIX + option
    return e


@dataclass(frozen=True)
class Ranks:
    """Where this process sits (SGLang's storage config): whose pages it
    keeps. A PP stage or an attention-CP rank holds other layers or another
    slice of every page, so each is its own namespace; TP ranks are the
    keys' rank, collapsed to 0 for MLA (every rank holds the same KV)."""

    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1
    is_mla: bool = False

    def part(self):
        """The namespace's part for PP and CP (empty in the plain case)."""
        out = ""
        if self.pp_size > 1:
            out += f":pp{self.pp_rank}/{self.pp_size}"
        if self.cp_size > 1:
            out += f":cp{self.cp_rank}/{self.cp_size}"
        return out


@dataclass(frozen=True)
class StorageOptions:
    server_socket: str
    model: str
    ranks: Ranks
    tenant: str = ""
    tenant_salt: str = ""
    weight_version: str = ""
    request_timeout_s: float = 5.0
    lease_bound_s: float = 30.0
    copy_threads: int = 3
    server_uid: int = -1
    public_tenant: str = ""

    @staticmethod
    def of(storage_config):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        for key in extra:
            if key not in SGLANG_KEYS and key not in OWN_KEYS:
                raise config_error(key, "not a kvstrand.sglang key (" + ", ".join(sorted(OWN_KEYS)) + ")")

        def get(key, default, kind):
            value = extra.get(key, default)
            if kind is float and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)
            if not isinstance(value, kind) or isinstance(value, bool) != (kind is bool):
                raise config_error(key, f"must be a {kind.__name__}, got {value!r}")
            return value

        socket = get("server_socket", "", str)
        if not socket:
            raise config_error("server_socket", "kvstrand-server's socket is required")
        model = getattr(storage_config, "model_name", None) or ""
        if not model:
            raise kvstrand.ConfigError("invalid option 'model_name': SGLang passed no model name, and the node "
                                       "tier's keys need one (it names the weights the KV was computed with)")
        revision = get("model_revision", "", str)
        if revision:
            model += f";revision={revision}"
        tenant = get("tenant", "", str)
        if (why := kvstrand.tenant_problem(tenant)) is not None:
            raise config_error("tenant", why)
        timeout = get("request_timeout_s", 5.0, float)
        if not 0 < timeout <= 600:
            raise config_error("request_timeout_s", f"must be more than 0 and at most 600 s, got {timeout}")
        lease = get("lease_bound_s", 30.0, float)
        if not 0 < lease <= 3600:
            raise config_error("lease_bound_s", f"must be more than 0 and at most 3600 s, got {lease}")
        threads = get("copy_threads", 3, int)
        if not 0 <= threads <= 64:
            raise config_error("copy_threads", f"must be 0 to 64, got {threads}")
        uid = get("server_uid", -1, int)
        public = get("public_tenant", "", str)
        if public and (why := kvstrand.tenant_problem(public)) is not None:
            raise config_error("public_tenant", why)
        if public and public == tenant:
            raise config_error("public_tenant", f"'{public}' is this engine's own tenant, whose pages it reads anyway")

        def field(name, default):
            return int(getattr(storage_config, name, default) or default)

        ranks = Ranks(tp_rank=field("tp_rank", 0), tp_size=field("tp_size", 1), pp_rank=field("pp_rank", 0),
                      pp_size=field("pp_size", 1), cp_rank=field("attn_cp_rank", 0),
                      cp_size=field("attn_cp_size", 1), is_mla=bool(getattr(storage_config, "is_mla_model", False)))
        return StorageOptions(server_socket=socket, model=model, ranks=ranks, tenant=tenant,
                              tenant_salt=get("tenant_salt", "", str), weight_version=get("weight_version", "", str),
                              request_timeout_s=timeout, lease_bound_s=lease, copy_threads=threads, server_uid=uid,
                              public_tenant=public)
