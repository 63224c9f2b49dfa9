"""kvstrand: KV-cache offload between GPU memory and a host tier shared by a
node's ranks, for Python engines.

The native module (kvstrand._kvstrand, over libkvstrand.so) holds everything
the C++ API has: the Connector, layouts and registrations, the planner and
chunk keys. Device memory is named by address (``tensor.data_ptr()``) and
streams and events by handle (``torch.cuda.Stream.cuda_stream``), as ints.

Errors: TransferRefused (nothing was posted), FailStop (a deadline passed:
stop the engine, reuse no block), ConfigError (an option kvstrand cannot
serve, naming it); all three derive from KvstrandError.

kvstrand.vllm is a vLLM KV connector built on this module.
"""

from ._kvstrand import *  # noqa: F401,F403
from ._kvstrand import __version__  # noqa: F401

del sim  # noqa: F821 - the native submodule; kvstrand.sim is its Python module (sim.py)
from . import sim  # noqa: E402

__all__ = [name for name in dir() if not name.startswith("_")]
