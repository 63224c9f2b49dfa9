"""What the scheduler-side connector hands the worker-side ones each step.

Plain Python values only: vLLM pickles it into the scheduler output it sends
to every worker process. Chunks travel as their 32-byte hashes (the same on
every rank); each worker makes its own rank's keys from them.
"""

from dataclasses import dataclass, field

from .interface import KVConnectorMetadata


@dataclass
class LoadJob:
    req_id: str
    begin: int                   # tokens [begin, end) into block_ids
    end: int
    block_ids: list              # one per block of [begin, end)
    chunk_hashes: list           # one per chunk the range touches
    handoff: dict                # TP rank -> the lease the scheduler exported for it (bytes)


@dataclass
class SaveJob:
    req_id: str
    begin: int                   # whole chunks [begin, end), computed by the end of this step
    end: int
    block_ids: list
    chunk_hashes: list


@dataclass
class KvstrandConnectorMetadata(KVConnectorMetadata):
    namespace: bytes = b""                          # the scheduler's; every worker's must match
    loads: list = field(default_factory=list)       # LoadJob
    saves: list = field(default_factory=list)       # SaveJob
    preempted: set = field(default_factory=set)     # request ids whose blocks were taken back this step
    delayed_free: set = field(default_factory=set)  # finished requests whose blocks wait for get_finished
    allocated: set = field(default_factory=set)     # blocks vLLM gave to requests this step (saves reading them end first)
