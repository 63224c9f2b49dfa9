"""The worker side of kvstrand.vllm: each TP rank's process registers its KV
cache tensors, adopts the leases the scheduler handed it, loads into the
blocks vLLM allocated, and saves whole chunks once a step's forward pass has
written them.

No call here waits for a copy except handle_preemptions (a fence, so that no
transfer touches blocks vLLM has taken back). A save waits for the forward
pass on the device (Producer.after_stream on the current stream); blocks of
a finished request are handed back through get_finished only once every
save reading them is terminal.
"""

import logging
import math
from collections import defaultdict, deque

import kvstrand

from .config import config_error

log = logging.getLogger("kvstrand.vllm")


def current_stream():
    """The current CUDA/HIP stream's handle (torch), or 0 without torch."""
    try:
        import torch  # noqa: PLC0415 - optional
    except ImportError:
        return 0
    if not torch.cuda.is_available():
        return 0
    return torch.cuda.current_stream().cuda_stream


class WorkerSide:
    def __init__(self, cfg, tp_rank, stream_provider=None):
        self.cfg = cfg
        self.rank = tp_rank
        self.layout = cfg.layout(tp_rank)
        kvstrand.validate(self.layout)
        self.namespace = kvstrand.namespace_of(self.layout)
        self.kv_rank = kvstrand.kv_rank_of(self.layout)
        self.writes = kvstrand.writes_to_tier(self.layout)
        self.stream_of = stream_provider or current_stream
        self.conn = kvstrand.Connector(cfg.connector_options())
        self.group = None
        self.adopting = {}                 # lookup id -> LoadJob
        self.loading = {}                  # request id -> LoadJob, posted
        self.saving = {}                   # request id -> its SaveJob posted and not terminal (one at a time)
        self.saves_queued = defaultdict(deque)  # request id -> SaveJobs behind its live save
        self.recved = set()                # loads ended since the last get_finished
        self.load_errors = set()           # blocks failed loads would have written
        self.awaiting_free = set()         # finished requests whose blocks vLLM waits for

    # ---- registration ----
    def register_kv_caches(self, kv_caches):
        """One plane per layer and K/V half (planes_per_layer), in the
        scheduler's order, each `num_blocks` blocks of page/planes bytes."""
        cfg, planes = self.cfg, []
        per_plane = cfg.layers[0].page_size_bytes // cfg.planes_per_layer
        for layer in cfg.layers:
            if layer.name not in kv_caches:
                raise config_error("kv_caches", f"no KV cache tensor for layer '{layer.name}'")
            t = kv_caches[layer.name]
            shape, elem = tuple(t.shape), t.element_size()
            if not t.is_contiguous():
                raise config_error("kv_caches", f"layer '{layer.name}': the KV cache tensor is not contiguous")
            # The block dimension: planes_per_layer regions before it, one block's plane bytes after it.
            found = [d for d in range(len(shape)) if shape[d] == cfg.num_blocks and
                     math.prod(shape[:d]) == cfg.planes_per_layer and math.prod(shape[d + 1:]) * elem == per_plane]
            if not found:
                raise config_error("kv_connector_extra_config.planes_per_layer",
                                    f"layer '{layer.name}': a tensor of shape {shape} is not {cfg.planes_per_layer} "
                                    f"region(s) of {cfg.num_blocks} blocks of {per_plane} bytes")
            for p in range(cfg.planes_per_layer):
                planes.append(kvstrand.PlaneMemory(t.data_ptr() + p * cfg.num_blocks * per_plane, cfg.num_blocks))
        self.group = self.conn.register_layout(kvstrand.Registration(self.layout, planes))

    # ---- per step ----
    def _producer(self):
        stream = self.stream_of()
        return kvstrand.Producer.after_stream(stream) if stream else kvstrand.Producer()

    def _spec(self, job, tier_lease=0):
        return kvstrand.TransferSpec(
            request=job.req_id, registration=self.group, tokens=kvstrand.TokenRange(job.begin, job.end),
            keys=[kvstrand.ChunkKey(self.namespace, self.kv_rank, h) for h in job.chunk_hashes],
            blocks=list(job.block_ids), tier_lease=tier_lease)

    def _load_failed(self, job, why):
        log.warning("kvstrand.vllm: load of %s [%d, %d) failed: %s", job.req_id, job.begin, job.end, why)
        self.load_errors.update(job.block_ids)
        self.recved.add(job.req_id)

    def handle_preemptions(self, preempted):
        if not preempted:
            return
        for req_id in preempted:  # not posted yet: never will be (the blocks are vLLM's again)
            self.saves_queued.pop(req_id, None)
        # Posted: terminal before this step's forward pass reuses the blocks.
        self.conn.fence(sorted(preempted), self.cfg.transfer_deadline_s)
        self._drain()

    def _fence_reallocated(self, allocated):
        """Requests whose saves (posted or queued) read, or whose loads
        write, blocks vLLM gave to a request this step are preempted, told or
        not: fenced as such before the forward pass writes those blocks."""
        if not allocated:
            return
        hit = {r for r, job in list(self.saving.items()) + list(self.loading.items())
               if allocated.intersection(job.block_ids)}
        hit |= {r for r, queue in self.saves_queued.items()
                if any(allocated.intersection(job.block_ids) for job in queue)}
        if hit:
            log.info("kvstrand.vllm: blocks of %s were given to other requests: fencing their saves", sorted(hit))
            self.handle_preemptions(hit)

    def start_load(self, meta):
        if self.group is None:
            raise RuntimeError("kvstrand.vllm: start_load_kv before register_kv_caches")
        if meta.namespace != self.namespace:
            raise config_error("kv_transfer_config",
                                f"the scheduler's layout (namespace {meta.namespace.hex()[:16]}) differs from TP rank "
                                f"{self.rank}'s ({self.namespace.hex()[:16]}): both must see the same model, dtype, "
                                "block size and kv_connector_extra_config")
        self.awaiting_free.update(meta.delayed_free)
        self._fence_reallocated(meta.allocated)
        for job in meta.loads:
            handoff = job.handoff.get(self.rank)
            if handoff is None:
                self._load_failed(job, f"no lease for TP rank {self.rank}")
                continue
            try:
                self.adopting[self.conn.adopt_lease(handoff)] = job
            except kvstrand.TransferRefused as e:
                self._load_failed(job, str(e))
        self._drain()

    def save(self, meta):
        if not self.writes:
            return  # replicated across TP: rank 0 stores the one copy
        for job in meta.saves:
            self.saves_queued[job.req_id].append(job)
        self._post_saves()

    def _post_saves(self):
        ops, jobs = [], []
        for req_id, queue in self.saves_queued.items():
            if queue and req_id not in self.saving:
                jobs.append(queue.popleft())
                ops.append(kvstrand.Op(kvstrand.TransferKind.save, self._spec(jobs[-1]), self._producer()))
        for req_id in [r for r, q in self.saves_queued.items() if not q]:
            del self.saves_queued[req_id]
        if not ops:
            return
        try:
            self.conn.submit(ops)
        except kvstrand.TransferRefused as e:  # a cache may drop a save; it is a later miss
            log.warning("kvstrand.vllm: %d save(s) refused: %s", len(ops), e)
            return
        for job in jobs:
            self.saving[job.req_id] = job

    def _drain(self):
        f = self.conn.finished()
        for answer in f.lookups:
            job = self.adopting.pop(answer.id)
            if answer.lease == 0 or answer.hit.tokens < job.end:
                if answer.lease:
                    self.conn.release_lookup(answer.lease)
                self._load_failed(job, f"the tier holds {answer.hit.tokens} of its tokens now")
                continue
            try:
                self.conn.load(self._spec(job, answer.lease), self._producer())
                self.loading[job.req_id] = job
            except kvstrand.TransferRefused as e:
                self.conn.release_lookup(answer.lease)
                self._load_failed(job, str(e))
        for out in f.loads:
            job = self.loading.pop(out.request, None)
            if not out.ok and job is not None:
                self._load_failed(job, out.reason)
            self.recved.add(out.request)
        for out in f.saves:
            self.saving.pop(out.request, None)
            if not out.ok:
                log.info("kvstrand.vllm: save of %s failed: %s", out.request, out.reason)
        self._post_saves()

    def get_finished(self, finished_req_ids):
        self._drain()
        adopting = {job.req_id for job in self.adopting.values()}
        sending = {r for r in self.awaiting_free
                   if r not in self.saving and r not in self.saves_queued and r not in self.loading and r not in adopting}
        self.awaiting_free -= sending
        recving, self.recved = self.recved, set()
        return (sending or None), (recving or None)

    def get_block_ids_with_load_errors(self):
        errors, self.load_errors = self.load_errors, set()
        return errors

    def shutdown(self):
        self.conn.close()
