"""What the scheduler-side connector hands the worker-side ones each step.

Plain Python values only: vLLM pickles it into the scheduler output it sends
to every worker process. Chunks travel as their 32-byte hashes (the same on
every rank); each worker makes its own rank's keys from them. A job has one
part per KV-cache group it moves (groups are kvstrand registrations).
"""

from dataclasses import dataclass, field

from .interface import KVConnectorMetadata


@dataclass
class GroupPart:
    group: int
    begin: int                   # tokens [begin, end) of this group, block-aligned
    end: int
    block_ids: list              # one per block of [begin, end), none of them the null block
    chunk_hashes: list           # one per chunk the range touches
    handoff: dict = field(default_factory=dict)  # loads: TP rank -> the lease exported for it (bytes)
    # Group 0 with Mamba groups: the Mamba blocks holding the checkpoint. A
    # save: per chunk, one per Mamba layer (-1 for a chunk end no step ended
    # on); a load: one per Mamba layer, written with the state at `end`.
    state_slots: list = field(default_factory=list)
    # A save with tier_events "server": per chunk, its vLLM blocks described
    # for the server's KV events (msgpack bytes, events.describe_chunks).
    chunk_events: list = field(default_factory=list)


@dataclass
class LoadJob:
    req_id: str
    begin: int                   # the request resumes at `end`; [begin, end) comes from the tier
    end: int
    parts: list                  # GroupPart, one per group with blocks to write

    @property
    def block_ids(self):
        """Every block it writes, Mamba state blocks included."""
        return [b for p in self.parts for b in p.block_ids] + [s for p in self.parts for s in p.state_slots if s > 0]


@dataclass
class SaveJob:
    req_id: str
    begin: int                   # whole chunks [begin, end), computed by the end of this step
    end: int
    parts: list                  # GroupPart, one per group whose blocks of the range are all still held
    save_id: int = 0             # the scheduler's number for it (KV events: each rank reports its end)

    @property
    def block_ids(self):
        """Every block it reads, Mamba state blocks included."""
        return [b for p in self.parts for b in p.block_ids] + [s for p in self.parts for s in p.state_slots if s > 0]


@dataclass
class KvstrandConnectorMetadata(KVConnectorMetadata):
    namespace: bytes = b""                          # the scheduler's (group 0); every worker's must match
    loads: list = field(default_factory=list)       # LoadJob
    saves: list = field(default_factory=list)       # SaveJob
    preempted: set = field(default_factory=set)     # request ids whose blocks were taken back this step
    delayed_free: set = field(default_factory=set)  # finished requests whose blocks wait for get_finished
    allocated: set = field(default_factory=set)     # blocks vLLM gave to requests this step (saves reading them end first)
