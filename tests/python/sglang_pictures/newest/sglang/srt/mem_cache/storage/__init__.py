from .backend_factory import StorageBackendFactory  # noqa: F401
