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

GPU_DEVICES = ("/dev/nvidia0", "/dev/kfd")  # an NVIDIA GPU; AMD's kernel driver


def _backend_problem(built, devices=GPU_DEVICES):
    """What is wrong with a module built for `built` on this machine (None:
    nothing): a sim build where a GPU is present cannot copy its memory."""
    import os  # noqa: PLC0415
    present = [d for d in devices if os.path.exists(d)]
    if built != "sim" or not present:
        return None
    return (f"kvstrand: this module was built with the sim backend, but this machine has a GPU ({present[0]}): "
            "transfers of GPU memory will fail. Reinstall it built for the GPU: KVSTRAND_GPU=cuda (or hip) "
            "pip install -v . (KVSTRAND_CUDA_ROOT=... where the CUDA toolkit is not in /usr/local/cuda)")


def _say_backend():
    import logging  # noqa: PLC0415
    log = logging.getLogger("kvstrand")
    log.debug("kvstrand: device backend %s", backend())  # noqa: F405
    if (problem := _backend_problem(backend())) is not None:  # noqa: F405
        log.warning("%s", problem)


_say_backend()

__all__ = [name for name in dir() if not name.startswith("_")]
