"""kvstrand.sglang: kvstrand-server as SGLang's HiCache storage backend.

SGLang loads it with its dynamic-backend flags, no patch to SGLang::

  --enable-hierarchical-cache --hicache-storage-backend dynamic
  --hicache-storage-backend-extra-config '{"backend_name": "kvstrand",
      "module_path": "kvstrand.sglang", "class_name": "KvstrandStorage",
      "interface_v1": 1, "server_socket": "/run/kvstrand/kvstrand.sock"}'

Each SGLang host pool (the KV pool, and a hybrid model's Mamba or SWA side
pools) is one kvstrand registration of one-page chunks; pages move between
SGLang's host pool and the node arena by this process's threads, the GIL
released, with no staging copy. docs/sglang.md has the keys, the supported
SGLang commits and what is refused.
"""

from .storage import KvstrandStorage  # noqa: F401

__all__ = ["KvstrandStorage"]
