"""A picture of SGLang's StorageBackendFactory at 001067f
(python/sglang/srt/mem_cache/storage/backend_factory.py): only the
"dynamic" path, which is how kvstrand.sglang is loaded."""

import importlib

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage


class StorageBackendFactory:
    @staticmethod
    def _load_backend_class(module_path, class_name, backend_name):
        module = importlib.import_module(module_path)
        cls = getattr(module, class_name)
        if not issubclass(cls, HiCacheStorage):
            raise TypeError(f"Backend class {class_name} must inherit from HiCacheStorage")
        return cls

    @classmethod
    def create_backend(cls, backend_name, storage_config, mem_pool_host, **kwargs):
        if backend_name == "dynamic" and storage_config.extra_config is not None:
            extra = storage_config.extra_config
            for required in ("backend_name", "module_path", "class_name"):
                if required not in extra:
                    raise ValueError(f"Missing required field '{required}' in backend config for 'dynamic' backend")
            backend_class = cls._load_backend_class(extra["module_path"], extra["class_name"], extra["backend_name"])
            # The factory hands the backend its keyword arguments as one dict.
            return backend_class(storage_config, kwargs)
        raise ValueError(f"Unknown storage backend '{backend_name}'.")
