"""The oldest picture's factory: the "dynamic" backend as SGLang loads it
(module and class from the extra config, a subclass check, then
cls(storage_config, kwargs)); its call form is unchanged up to 001067f."""

import importlib

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage


class StorageBackendFactory:
    @classmethod
    def create_backend(cls, backend_name, storage_config, mem_pool_host, **kwargs):
        extra = storage_config.extra_config
        if backend_name != "dynamic" or extra is None:
            raise ValueError(f"Unknown storage backend '{backend_name}'.")
        missing = [f for f in ("backend_name", "module_path", "class_name") if f not in extra]
        if missing:
            raise ValueError(f"Missing required field '{missing[0]}' in backend config for 'dynamic' backend")
        backend_class = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
        if not issubclass(backend_class, HiCacheStorage):
            raise TypeError(f"Backend class {extra['class_name']} must inherit from HiCacheStorage")
        return backend_class(storage_config, kwargs)
