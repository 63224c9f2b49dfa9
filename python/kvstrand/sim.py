"""The sim backend's test helpers (kvstrand._kvstrand.sim as a module of its
own, so that ``import kvstrand.sim`` works and has stubs): device memory
the host can see, and fault hooks on streams. On a GPU backend available()
is False and every other call raises RuntimeError."""

from ._kvstrand import sim as _sim

SimBuffer = _sim.SimBuffer
available = _sim.available
allocate = _sim.allocate
hold_stream = _sim.hold_stream
release_stream = _sim.release_stream
set_stream_delay = _sim.set_stream_delay

__all__ = ["SimBuffer", "available", "allocate", "hold_stream", "release_stream", "set_stream_delay"]
