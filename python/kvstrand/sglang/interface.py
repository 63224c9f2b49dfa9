"""What kvstrand.sglang takes from SGLang: the storage base class and the v2
types, from SGLang when it is importable, else kvstrand's own stand-ins of
the same shape (so that the module imports, and its rules are testable,
where SGLang is not installed). Read from SGLang's
``sglang/srt/mem_cache/hicache_storage.py``."""

from dataclasses import dataclass, field

try:  # pragma: no cover - which branch runs depends on the machine
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage  # noqa: F401

    FROM_SGLANG = True
except ImportError:
    FROM_SGLANG = False

    class HiCacheStorage:  # noqa: D101 - SGLang's base, as far as backends see it
        def register_mem_pool_host(self, mem_pool_host):
            self.mem_pool_host = mem_pool_host


try:  # the v2 types: SGLang's own from the commits that have them
    from sglang.srt.mem_cache.hicache_storage import PoolTransferResult  # noqa: F401
except ImportError:

    @dataclass
    class PoolTransferResult:  # noqa: D101
        kv_hit_pages: int
        extra_pool_hit_pages: dict = field(default_factory=dict)


def is_trailing(policy):
    """Whether a pool's hit policy asks for only the last pages of the hit
    (Mamba's state, SWA's window): by value, so SGLang's enum, kvstrand's
    stand-in and a plain string all compare."""
    return str(getattr(policy, "value", policy)) == "trailing_pages"


def pool_name(name):
    """A pool's name as a plain string (SGLang's PoolName is a str enum)."""
    return str(getattr(name, "value", name))


def make_result(kv_hit_pages, extra_pool_hit_pages):
    """A PoolTransferResult; restorable_prefix_pages too where the commit's
    class has it (newer SGLang): the end point legal for every pool."""
    r = PoolTransferResult(kv_hit_pages, extra_pool_hit_pages)
    if hasattr(r, "restorable_prefix_pages"):
        r.restorable_prefix_pages = kv_hit_pages
    return r
