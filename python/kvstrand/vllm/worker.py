"""The worker side of kvstrand.vllm: each TP rank's process registers its KV
cache tensors (one kvstrand registration per KV-cache group), adopts the
leases the scheduler handed it, loads into the blocks vLLM allocated, and
saves whole chunks once a step's forward pass has written them.

No call here waits for a copy except the fences before a forward pass (so
that no transfer touches blocks vLLM has taken back or given to another
request). A save waits for the forward pass on the device
(Producer.after_stream on the current stream); blocks of a finished request
are handed back through get_finished only once every save reading them is
terminal.
"""

import logging
import math
from collections import defaultdict, deque

import kvstrand

from .config import config_error
from .events import KvstrandKVEvents, SaveEnded
from .interface import KVConnectorTransferResults

log = logging.getLogger("kvstrand.vllm")


def current_stream():
    """The current CUDA/HIP stream's handle (torch), or None without torch or
    a GPU. 0 is a handle like any other: torch's default stream, the legacy
    one, where a forward pass runs unless a stream is set."""
    try:
        import torch  # noqa: PLC0415 - optional
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.current_stream().cuda_stream


class _Live:
    """A job posted to the Connector: one transfer per group part."""

    def __init__(self, job):
        self.job = job
        self.open = {p.group for p in job.parts}
        self.failed = []  # reasons


class WorkerSide:
    def __init__(self, cfg, tp_rank, stream_provider=None, stats=None):
        self.cfg = cfg
        self.rank = tp_rank
        self.layouts = [cfg.layout(tp_rank, g) for g in range(len(cfg.groups))]
        for layout in self.layouts:
            kvstrand.validate(layout)
        self.namespaces = [kvstrand.namespace_of(layout) for layout in self.layouts]
        self.namespace = self.namespaces[0]
        self.kv_rank = kvstrand.kv_rank_of(self.layouts[0])
        self.writes = kvstrand.writes_to_tier(self.layouts[0])
        self.stream_of = stream_provider or current_stream
        self.stats = stats
        self.conn = kvstrand.Connector(cfg.connector_options())
        self.registrations = None          # group -> registration id
        self.prepared = None               # the metadata whose fences ran
        self.adopting = {}                 # lookup id -> (live load, part)
        self.loading = {}                  # request id -> _Live load, until every part is terminal
        self.saving = {}                   # request id -> _Live save, posted and not terminal (one at a time)
        self.saves_queued = defaultdict(deque)  # request id -> SaveJobs behind its live save
        self.recved = set()                # loads ended since the last get_finished
        self.failed_loads = set()          # of those, the ones that failed (a newer vLLM's report)
        self.load_errors = set()           # blocks failed loads would have written (v0.18's report)
        # Whether vLLM takes failures per request (get_transfer_results), set
        # by its first call: then no block ids are reported, as vLLM refuses
        # them under several KV-cache groups (its block ids are per group).
        self.per_request = False
        self.awaiting_free = set()         # finished requests whose blocks vLLM waits for
        self.saves_ended = [] if cfg.kv_events else None  # SaveEnded for the scheduler's KV events

    # ---- registration ----
    def register_kv_caches(self, kv_caches):
        """Per group, one plane per layer and K/V half (planes_per_layer), in
        the scheduler's order, each `num_blocks` blocks of page/planes bytes."""
        cfg = self.cfg
        self.registrations = []
        for g, group in enumerate(cfg.groups):
            planes = []
            for layer in group.layers:
                per_plane = layer.page_size_bytes // cfg.planes_per_layer
                if layer.name not in kv_caches:
                    raise config_error("kv_caches", f"no KV cache tensor for layer '{layer.name}'")
                t = kv_caches[layer.name]
                shape, elem = tuple(t.shape), t.element_size()
                if cfg.block_major:
                    planes.append(self._block_major_plane(layer, t, per_plane))
                    continue
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
            state = self._state_parts(kv_caches) if g == 0 else []
            self.registrations.append(
                self.conn.register_layout(kvstrand.Registration(self.layouts[g], planes, state_parts=state)))

    def _block_major_plane(self, layer, t, page):
        """An attention layer's cache in a Mamba hybrid: vLLM's (2, num_blocks,
        ...) view whose strides put block b's K at b * page and its V half a
        page after, so the layer is one region of `page` bytes per block."""
        cfg, shape, elem = self.cfg, tuple(t.shape), t.element_size()
        strides = tuple(t.stride(d) * elem for d in range(2)) if len(shape) >= 2 else ()
        if shape[:2] != (2, cfg.num_blocks) or strides != (page // 2, page):
            raise config_error("kv_caches", f"layer '{layer.name}': a tensor of shape {shape} and byte strides "
                                            f"{strides} is not vLLM's hybrid layout: (2, {cfg.num_blocks}, ...) with "
                                            f"strides ({page // 2}, {page}), K and V of a block adjacent")
        return kvstrand.PlaneMemory(t.data_ptr(), cfg.num_blocks)

    def _state_parts(self, kv_caches):
        """Every Mamba layer's state memory: its blocks' pages (vLLM's conv
        and SSM state views start at the page; the first is at its start),
        one slot per block."""
        cfg, parts = self.cfg, []
        for layer in cfg.state_layers:
            if layer.name not in kv_caches:
                raise config_error("kv_caches", f"no state tensor for Mamba layer '{layer.name}'")
            t = kv_caches[layer.name]
            if isinstance(t, (list, tuple)):
                t = t[0]  # vLLM: [conv_state, ssm_state], views of one page per block
            shape, elem = tuple(t.shape), t.element_size()
            stride = t.stride(0) * elem if hasattr(t, "stride") else math.prod(shape[1:]) * elem
            if not shape or shape[0] != cfg.num_blocks or stride != layer.page_size_bytes:
                raise config_error("kv_caches", f"Mamba layer '{layer.name}': a state tensor of shape {shape} is not "
                                                f"{cfg.num_blocks} blocks {layer.page_size_bytes} bytes apart")
            parts.append(kvstrand.StateMemory(t.data_ptr(), cfg.num_blocks, layer.page_size_bytes))
        return parts

    # ---- per step ----
    def _producer(self):
        # Not `if stream`: handle 0 is torch's default stream, and a save that
        # did not wait for it would copy blocks the forward pass has not written.
        stream = self.stream_of()
        return kvstrand.Producer.after_stream(stream) if stream is not None else kvstrand.Producer()

    def _spec(self, req_id, part, tier_lease=0):
        with_state = any(s >= 0 for s in part.state_slots)  # a save's chunks may all lack an image
        return kvstrand.TransferSpec(
            request=req_id, registration=self.registrations[part.group], tokens=kvstrand.TokenRange(part.begin, part.end),
            keys=[kvstrand.ChunkKey(self.namespaces[part.group], self.kv_rank, h) for h in part.chunk_hashes],
            blocks=list(part.block_ids), tier_lease=tier_lease,
            with_state=with_state, state_slots=list(part.state_slots) if with_state else [],
            # One rank describes a chunk: every TP rank saves its own object of
            # it, and the server announces each described object (one
            # BlockStored per rank, and as many descriptions held, otherwise).
            chunk_events=list(part.chunk_events) if self.kv_rank == 0 else [])

    def _part_ended(self, live, group, why=None):
        """One group's load ended (landed, or failed with `why`); the load
        ends when every group's has."""
        job = live.job
        live.open.discard(group)
        if why is not None:
            live.failed.append(why)
        if live.open:
            return
        del self.loading[job.req_id]
        if live.failed:
            log.warning("kvstrand.vllm: load of %s [%d, %d) failed: %s", job.req_id, job.begin, job.end,
                        "; ".join(live.failed))
            # Every block of a load vLLM is told failed: it recomputes from the
            # first, and a part that landed is no use without the others.
            self.load_errors.update(job.block_ids)
            self.failed_loads.add(job.req_id)
        if self.stats is not None:
            self.stats.load_ended(job.end - job.begin, not live.failed)
        self.recved.add(job.req_id)

    def handle_preemptions(self, preempted):
        if not preempted:
            return
        for req_id in preempted:  # not posted yet: never will be (the blocks are vLLM's again)
            for job in self.saves_queued.pop(req_id, ()):
                self._save_ended(job, None, False)
        # Posted: terminal before this step's forward pass reuses the blocks.
        self.conn.fence(sorted(preempted), self.cfg.transfer_deadline_s)
        self._drain()

    def before_forward(self, meta):
        """Once per step, before the forward pass writes anything: the
        transfers of requests vLLM preempted, and of any whose saves read or
        loads write a block vLLM gave out this step (told or not: a sliding
        window's passed blocks are freed silently), end first."""
        if self.prepared is meta:
            return
        self.prepared = meta
        if meta.namespace != self.namespace:
            raise config_error("kv_transfer_config",
                                f"the scheduler's layout (namespace {meta.namespace.hex()[:16]}) differs from TP rank "
                                f"{self.rank}'s ({self.namespace.hex()[:16]}): both must see the same model, dtype, "
                                "block size and kv_connector_extra_config")
        self.awaiting_free.update(meta.delayed_free)
        hit = set(meta.preempted)
        allocated = meta.allocated
        if allocated:
            hit |= {r for r, live in list(self.saving.items()) + list(self.loading.items())
                    if allocated.intersection(live.job.block_ids)}
            hit |= {r for r, queue in self.saves_queued.items()
                    if any(allocated.intersection(job.block_ids) for job in queue)}
        if hit - set(meta.preempted):
            log.info("kvstrand.vllm: blocks of %s were given to other requests: fencing their transfers",
                     sorted(hit - set(meta.preempted)))
        self.handle_preemptions(hit)

    def start_load(self, meta):
        if self.registrations is None:
            raise RuntimeError("kvstrand.vllm: start_load_kv before register_kv_caches")
        self.before_forward(meta)
        for job in meta.loads:
            live = self.loading[job.req_id] = _Live(job)
            for part in job.parts:
                handoff = part.handoff.get(self.rank)
                if handoff is None:
                    self._part_ended(live, part.group, f"no lease for TP rank {self.rank}")
                    continue
                try:
                    self.adopting[self.conn.adopt_lease(handoff)] = (live, part)
                except kvstrand.TransferRefused as e:
                    self._part_ended(live, part.group, str(e))
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
                ops.extend(kvstrand.Op(kvstrand.TransferKind.save, self._spec(req_id, part), self._producer())
                           for part in jobs[-1].parts)
        for req_id in [r for r, q in self.saves_queued.items() if not q]:
            del self.saves_queued[req_id]
        if not ops:
            return
        try:
            self.conn.submit(ops)
        except kvstrand.TransferRefused as e:  # a cache may drop a save; it is a later miss
            log.warning("kvstrand.vllm: %d save(s) refused: %s", len(ops), e)
            for job in jobs:
                self._save_ended(job, None, False)
            return
        for job in jobs:
            self.saving[job.req_id] = _Live(job)

    def _save_ended(self, job, group, committed):
        """For KV events: `group`'s part of `job` ended (None: every part)."""
        if self.saves_ended is None:
            return
        for part in job.parts:
            if group is None or part.group == group:
                self.saves_ended.append(SaveEnded(job.save_id, part.group, self.rank, committed))

    def _group_of(self, registration):
        return self.registrations.index(registration)

    def _drain(self):
        f = self.conn.finished()
        for answer in f.lookups:
            live, part = self.adopting.pop(answer.id)
            if answer.lease == 0 or answer.hit.tokens < part.end:
                if answer.lease:
                    self.conn.release_lookup(answer.lease)
                self._part_ended(live, part.group, f"the tier holds {answer.hit.tokens} of its tokens now")
                continue
            try:
                self.conn.load(self._spec(live.job.req_id, part, answer.lease), self._producer())
            except kvstrand.TransferRefused as e:
                self.conn.release_lookup(answer.lease)
                self._part_ended(live, part.group, str(e))
        for out in f.loads:
            live = self.loading.get(out.request)
            if live is not None:
                self._part_ended(live, self._group_of(out.registration), None if out.ok else out.reason)
        for out in f.saves:
            live = self.saving.get(out.request)
            if live is None:
                continue
            group = self._group_of(out.registration)
            live.open.discard(group)
            self._save_ended(live.job, group, out.ok)
            if not out.ok:
                live.failed.append(out.reason)
                log.info("kvstrand.vllm: save of %s failed: %s", out.request, out.reason)
            if not live.open:
                del self.saving[out.request]
                if self.stats is not None:
                    self.stats.save_ended(live.job.end - live.job.begin, not live.failed)
        self._post_saves()

    def _ended(self):
        self._drain()
        sending = {r for r in self.awaiting_free
                   if r not in self.saving and r not in self.saves_queued and r not in self.loading}
        self.awaiting_free -= sending
        recving, self.recved = self.recved, set()
        failed, self.failed_loads = self.failed_loads, set()
        return sending, recving, failed

    def get_finished(self, finished_req_ids):
        sending, recving, _ = self._ended()
        return (sending or None), (recving or None)

    def get_transfer_results(self, finished_req_ids):
        """A newer vLLM's report: a failed load's request is in both
        finished_recving and failed_recving, and its blocks are not named."""
        self.per_request = True
        sending, recving, failed = self._ended()
        return KVConnectorTransferResults(finished_sending=sending, finished_recving=recving, failed_recving=failed)

    def kv_cache_events(self):
        """The saves that ended since the last call, for the scheduler's KV
        events (None when vLLM publishes none, or nothing ended)."""
        if not self.saves_ended:
            return None
        records, self.saves_ended = self.saves_ended, []
        return KvstrandKVEvents(records)

    def get_block_ids_with_load_errors(self):
        errors, self.load_errors = self.load_errors, set()
        return set() if self.per_request else errors

    def shutdown(self):
        self.conn.close()
