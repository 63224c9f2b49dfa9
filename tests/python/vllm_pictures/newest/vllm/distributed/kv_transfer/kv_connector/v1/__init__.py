from .base import KVConnectorBase_V1, KVConnectorRole, SupportsHMA  # noqa: F401
