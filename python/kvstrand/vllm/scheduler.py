"""The scheduler side of kvstrand.vllm: looks prompts up in the node tier,
plans what to load (plan_groups) and what to save (SaveTracker), and hands
each TP rank's leases to the workers through the step's metadata.

The scheduler has no device memory: its Connector registers one lookup-only
registration per TP rank and KV-cache group (each rank's keys carry its
rank, each group's its namespace). Lookups are posted, never waited for:
get_num_new_matched_tokens answers None ("not known yet") until every
answer has arrived.

Block rules vLLM's bookkeeping imposes (vllm/v1/core/sched/scheduler.py):
- A request aborted while its load is in flight is kept by vLLM itself until
  finished_recving; request_finished must then answer False, or the same id
  would come back as sent after vLLM deleted the request (its assertion).
- The null block (id 0) stands for a sliding-window group's slots outside
  the window, and for a Mamba group's blocks that hold no state: it is never
  saved or loaded into.
- Mamba groups (--mamba-cache-mode align): the block at index i of a Mamba
  group holds the state at (i + 1) * block_size when a step ended there.
  A save carries that state for the chunk its step ended on; a load writes
  the state at its end into the block vLLM allocated for it (index
  end / block_size - 1); a local hit ends where such a state is cached.
"""

import logging

import kvstrand

from . import keys
from .events import EventLog, KvstrandKVEvents, describe_chunks, spec_fields
from .metadata import GroupPart, KvstrandConnectorMetadata, LoadJob, SaveJob

log = logging.getLogger("kvstrand.vllm")

NULL_BLOCK = 0


def _current_block_ids(block_state, req_id):
    """A request's block ids per group as vLLM's KVConnectorBlockState has
    them (a snapshot dict, or resolved on access), or None."""
    if block_state is None:
        return None
    snapshot = getattr(block_state, "block_ids", None)
    if isinstance(snapshot, dict):
        return snapshot.get(req_id)
    resolve = getattr(block_state, "get_block_ids", None)
    return resolve(req_id) if resolve is not None else None


class _Request:
    def __init__(self, req_id, prompt, hashes, chunk_tokens, epoch):
        self.id = req_id
        self.prompt = prompt
        self.hashes = hashes               # group -> one hash per full chunk of the prompt ([] if not keyable)
        self.lookups = {}                  # (TP rank, group) -> lookup id, while posted
        self.answers = {}                  # (TP rank, group) -> LookupOutcome (its lease held until handed off or released)
        self.matched = None                # (num_computed_tokens, tokens to load) last answered
        self.load_decided = False
        self.block_ids = []                # group -> vLLM's block ids, as last seen
        self.tracker = kvstrand.SaveTracker(chunk_tokens)
        self.saves_posted = False          # a save of it went to the workers
        self.load_blocks = None            # blocks of its load in flight (until finished_recving)
        self.load_failures = 0
        self.epoch = epoch                 # the key epoch its hashes are of
        self.source = None                 # vLLM's Request (its block hashes name the blocks in KV events)


class SchedulerSide:
    def __init__(self, cfg, stats=None):
        self.cfg = cfg
        self.stats = stats
        self.conn = kvstrand.Connector(cfg.connector_options())
        self.ngroups = len(cfg.groups)
        self.vllm_groups = len(cfg.groups) + len(cfg.state_groups)  # Mamba groups have blocks, not registrations
        # layouts[rank][group]; registration id = rank * ngroups + group.
        self.layouts = [[cfg.layout(rank, g) for g in range(self.ngroups)] for rank in range(cfg.tp_size)]
        for per_rank in self.layouts:
            for layout in per_rank:
                kvstrand.validate(layout)
        self.registrations = {(rank, g): self.conn.register_layout(kvstrand.Registration(layout))
                              for rank, per_rank in enumerate(self.layouts) for g, layout in enumerate(per_rank)}
        self.namespaces = [kvstrand.namespace_of(layout) for layout in self.layouts[0]]
        self.namespace = self.namespaces[0]
        self.ranks_of_key = [kvstrand.kv_rank_of(per_rank[0]) for per_rank in self.layouts]
        self.epoch = 0                     # reset_cache: a new key epoch
        self.requests = {}
        self.by_lookup = {}                # lookup id -> (request id, rank, group)
        self.loads = []                    # LoadJobs for the next metadata
        self.delayed_free = set()
        self.freeing = set()               # finished requests whose blocks vLLM holds for their saves
        self.next_save_id = 1
        # KV events, when vLLM publishes them: saves are announced once every
        # rank that writes to the tier committed them.
        writers = [rank for rank in range(cfg.tp_size) if kvstrand.writes_to_tier(self.layouts[rank][0])]
        # With tier_events "server", kvstrand-server announces the tier's
        # blocks (each save carries their descriptions) and this engine none.
        self.events = (EventLog(writers, cfg.block_size, [g.index for g in cfg.groups], cfg.groups,
                                cfg.hash_block_size)
                       if cfg.kv_events and cfg.tier_events == "engine" else None)

    # ---- helpers ----
    def _hashes(self, request):
        hashes = [keys.chunk_hashes(ns, request, self.cfg.chunk_tokens, self.epoch) for ns in self.namespaces]
        if hashes[0] is None:
            return [[] for _ in self.namespaces]  # not keyable: never looked up nor stored
        return hashes

    def _request(self, request):
        r = self.requests.get(request.request_id)
        if r is None:
            prompt = list(request.prompt_token_ids or [])
            r = self.requests[request.request_id] = _Request(request.request_id, prompt, self._hashes(request),
                                                             self.cfg.chunk_tokens, self.epoch)
        elif r.epoch != self.epoch and not r.load_decided:
            self._rekey(r, request)
        r.source = request
        return r

    def _rekey(self, r, request):
        """A request first seen before reset_cache: looked up again under
        the new epoch's keys (answers in flight are released on arrival)."""
        self._release(r)
        r.lookups = {}
        r.hashes, r.epoch = self._hashes(request), self.epoch
        r.tracker = kvstrand.SaveTracker(self.cfg.chunk_tokens)

    def _drain(self):
        for answer in self.conn.finished().lookups:
            req_id, rank, g = self.by_lookup.pop(answer.id)
            r = self.requests.get(req_id)
            if r is None or r.lookups.get((rank, g)) != answer.id:  # finished meanwhile
                if answer.lease:
                    self.conn.release_lookup(answer.lease)
                continue
            del r.lookups[(rank, g)]
            r.answers[(rank, g)] = answer
            if self.events is not None and self.cfg.groups[g].kind == "full":
                # A full-attention group's chunks are saved from token 0 on, so
                # a shorter prefix than announced means some were evicted. (A
                # sliding window's early chunks are never saved: no inference.)
                self.events.prefix_found(g, r.hashes[g], answer.hit.tokens // self.cfg.chunk_tokens)

    def _release(self, r, which=None):
        for key in list(r.answers if which is None else which):
            answer = r.answers.pop(key)
            if answer.lease:
                self.conn.release_lookup(answer.lease)

    def _readmit(self, r):
        stored = r.tracker.frontier
        r.tracker = kvstrand.SaveTracker(self.cfg.chunk_tokens)
        r.tracker.note_stored(stored)
        r.load_decided, r.matched = False, None

    def _post_lookups(self, r):
        for (rank, g), registration in self.registrations.items():
            if (rank, g) in r.lookups or (rank, g) in r.answers:
                continue
            chunk_keys = [kvstrand.ChunkKey(self.namespaces[g], self.ranks_of_key[rank], h) for h in r.hashes[g]]
            try:
                lookup = self.conn.lookup(chunk_keys, registration)
            except kvstrand.TransferRefused as e:
                if e.code != kvstrand.TransferErrc.too_many_live:
                    raise
                return  # the rest are posted at the next call
            r.lookups[(rank, g)] = lookup
            self.by_lookup[lookup] = (r.id, rank, g)

    def _group_hits(self, r):
        """Per group, what every rank holds from token 0 (and the chunk ends
        every rank holds a checkpoint for). A hit the server did not lease
        (its per-client bound) cannot be handed over: none."""
        hits = [None] * self.ngroups
        for (rank, g), a in r.answers.items():
            tokens, points = (a.hit.tokens, set(a.hit.checkpoints)) if a.lease else (0, set())
            hits[g] = (tokens, points) if hits[g] is None else (min(hits[g][0], tokens), hits[g][1] & points)
        return [kvstrand.HitSource(h[0], sorted(p for p in h[1] if p <= h[0])) if h else kvstrand.HitSource(0)
                for h in hits]

    # ---- vLLM's calls ----
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        r = self._request(request)
        if r.load_decided:
            # vLLM asks again for a request it preempted and admits afresh, or
            # whose load failed from its first block (it freed the blocks):
            # the tier may hold what was saved of it, so look it up again.
            self._readmit(r)
            if r.epoch != self.epoch:
                self._rekey(r, request)
        if len(r.hashes[0]) == 0:
            return 0, False
        if r.load_failures >= self.cfg.max_load_failures:
            return 0, False  # its loads keep failing: computed from here on
        self._drain()
        if len(r.answers) < len(self.registrations):
            self._post_lookups(r)  # those not posted yet (too many live before)
            return None, False  # not known yet: vLLM asks again at a later step
        hits = self._group_hits(r)
        # vLLM's local hit ends where every Mamba group has the state cached.
        local = kvstrand.HitSource(num_computed_tokens, [num_computed_tokens] if num_computed_tokens else [])
        plan = kvstrand.plan_groups(
            [kvstrand.GroupHitInputs(self.layouts[0][g], hbm=local, tier=hits[g]) for g in range(self.ngroups)],
            len(r.prompt), self.cfg.min_load_tokens)
        n = 0
        if plan.frontier > num_computed_tokens and all(
                p.load is not None and p.load.begin == num_computed_tokens for p in plan.groups):
            n = plan.frontier - num_computed_tokens
        r.matched = (num_computed_tokens, n)
        return n, n > 0

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        r = self._request(request)
        r.block_ids = [list(ids) for ids in blocks.get_block_ids()]
        if r.load_decided:
            return  # the second call, after the load: blocks only
        if self.stats is not None and r.matched:  # once per admission (vLLM may ask get_num_new_matched_tokens again)
            self.stats.lookup(len(r.prompt) - r.matched[0], num_external_tokens)
        if num_external_tokens > 0 and r.matched and r.matched[1] == num_external_tokens and \
                len(r.answers) == len(self.registrations):
            job = self._load_job(r, r.matched[0], r.matched[0] + num_external_tokens)
            r.load_decided = True
            r.tracker.load_decided(kvstrand.TokenRange(job.begin, job.end))
            # What it loads is stored already, whether or not the copy lands.
            r.tracker.load_settled(kvstrand.LoadOutcome.landed)
            if job.parts:
                self.loads.append(job)
                r.load_blocks = set(job.block_ids)
            return
        if r.answers:
            r.tracker.note_stored(min(h.tokens for h in self._group_hits(r)))
        self._release(r)
        r.tracker.spend_tier_attempt()
        r.load_decided = True

    def _load_job(self, r, begin, end):
        """Each group's part of the load: the blocks vLLM allocated for
        [begin, end), less a sliding window's null blocks (a prefix of the
        range: the slots the window has passed)."""
        bs, ct = self.cfg.block_size, self.cfg.chunk_tokens
        parts = []
        for g, group in enumerate(self.cfg.groups):
            ids = r.block_ids[group.index][begin // bs:end // bs]
            first = next((i for i, b in enumerate(ids) if b != NULL_BLOCK), len(ids))
            group_keys = [(rank, g) for rank in range(self.cfg.tp_size)]
            if first == len(ids) or NULL_BLOCK in ids[first:]:
                self._release(r, group_keys)  # nothing of this group to write
                continue
            b = begin + first * bs
            slots = self._state_blocks(r, end) if g == 0 and self.cfg.state_groups else []
            if NULL_BLOCK in slots:
                # vLLM allocates the block a load's state goes to; without it the
                # load cannot restore the state: it fails (no lease handed), and
                # vLLM recomputes.
                log.error("kvstrand.vllm: %s: no Mamba block allocated at token %d to load the state into",
                          r.id, end)
                self._release(r, group_keys)
                parts.append(GroupPart(g, b, end, ids[first:], r.hashes[g][b // ct:-(-end // ct)], {}))
                continue
            handoff = {rank: self.conn.export_lease(r.answers.pop((rank, g)).lease) for rank, _ in group_keys}
            parts.append(GroupPart(g, b, end, ids[first:], r.hashes[g][b // ct:-(-end // ct)], handoff, slots))
        return LoadJob(r.id, begin, end, parts)

    def _state_blocks(self, r, at):
        """Every Mamba layer's block at token `at` (a block boundary) in the
        request's block table, in the checkpoint image's order; the null
        block where a group has none there. For a load: vLLM allocated these
        for the state the request resumes from."""
        i = at // self.cfg.block_size - 1
        out = []
        for group in self.cfg.state_groups:
            ids = r.block_ids[group.index] if group.index < len(r.block_ids) else []
            out.extend([ids[i] if 0 <= i < len(ids) else NULL_BLOCK] * len(group.layers))
        return out

    def _handed_state_blocks(self, offers, at):
        """The blocks vLLM handed over as holding each Mamba group's state at
        token `at` (kv_connector_block_state.boundary_state_offloads:
        (vLLM group, block, boundary tokens)), in the image's order; the null
        block for a group it named none for. In align mode vLLM replaces a
        state block (copy on write) and frees the one it superseded, so the
        block at that position of a table kept from earlier steps may hold
        another state, or be another request's."""
        named = {(int(g), int(tokens)): int(block) for g, block, tokens in offers or ()}
        out = []
        for group in self.cfg.state_groups:
            out.extend([named.get((group.index, at), NULL_BLOCK)] * len(group.layers))
        return out

    def _save_parts(self, r, begin, end, computed_before, step_end, offers=None):
        """Each group's part of saving [begin, end). A sliding-window group's
        blocks the window had passed when this step was scheduled may be
        freed (vLLM nulls them): such a group saves nothing of the range, and
        its hits end before it. With Mamba groups, group 0's part carries the
        state of the chunk this step ends on (`step_end`): the only chunk end
        whose state the Mamba blocks hold now: the block vLLM handed over for
        it where vLLM hands them over (`offers` not None), else the table's
        block at that boundary (v0.18, where the table is append-only)."""
        bs, ct = self.cfg.block_size, self.cfg.chunk_tokens
        parts = []
        for g, group in enumerate(self.cfg.groups):
            ids = r.block_ids[group.index][begin // bs:end // bs] if group.index < len(r.block_ids) else []
            if len(ids) != (end - begin) // bs or NULL_BLOCK in ids:
                continue
            if group.sliding_window and begin // bs < max(0, computed_before - group.sliding_window + 1) // bs:
                continue
            slots = []
            if g == 0 and self.cfg.state_groups and end == step_end:
                at_end = self._state_blocks(r, end) if offers is None else self._handed_state_blocks(offers, end)
                if NULL_BLOCK not in at_end:
                    slots = [-1] * (len(at_end) * ((end - begin) // ct - 1)) + at_end
            parts.append(GroupPart(g, begin, end, ids, r.hashes[g][begin // ct:end // ct], state_slots=slots))
        return parts

    def build_connector_meta(self, scheduler_output):
        self._drain()  # every step: an answer for a request finished meanwhile gives its lease back now
        meta = KvstrandConnectorMetadata(namespace=self.namespace, loads=self.loads, delayed_free=self.delayed_free,
                                         preempted=set(getattr(scheduler_output, "preempted_req_ids", None) or ()))
        self.loads, self.delayed_free = [], set()
        # Blocks given out this step to be written (not those a prefix-cache
        # hit only reads). vLLM may not say which requests it preempted
        # (preempted_req_ids is empty in some versions), and frees a sliding
        # window's passed blocks without a word; a worker whose save still
        # reads one of these fences it before the forward pass.
        bs = self.cfg.block_size
        for job in meta.loads:
            meta.allocated.update(job.block_ids)
        computed = {}
        for new in scheduler_output.scheduled_new_reqs:
            for ids in new.block_ids:
                meta.allocated.update(ids[new.num_computed_tokens // bs:])
            r = self.requests.get(new.req_id)
            if r is not None:
                r.block_ids = [list(ids) for ids in new.block_ids]
                computed[r.id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", None) or ())
        for i, req_id in enumerate(cached.req_ids):
            new_ids = cached.new_block_ids[i]
            if new_ids:  # a resumed request's lists are whole: their prefix-cache part is only read
                first = cached.num_computed_tokens[i] // bs if req_id in resumed else 0
                for ids in new_ids:
                    meta.allocated.update(ids[first:])
            r = self.requests.get(req_id)
            if r is None:
                continue
            if req_id in resumed:
                r.block_ids = [list(ids) for ids in new_ids] if new_ids else [[] for _ in range(self.vllm_groups)]
            elif new_ids:
                for g, ids in enumerate(new_ids):
                    r.block_ids[g].extend(ids)
            computed[req_id] = cached.num_computed_tokens[i]
        meta.allocated.discard(NULL_BLOCK)
        # vLLM's own view of the tables (newer vLLM): authoritative where a
        # table changed in place (align mode's copy on write), and the Mamba
        # boundary states it hands over this step.
        block_state = getattr(scheduler_output, "kv_connector_block_state", None)
        offers = getattr(block_state, "boundary_state_offloads", None) if block_state is not None else None
        for req_id in computed:
            current = _current_block_ids(block_state, req_id)
            if current is not None:
                self.requests[req_id].block_ids = [list(ids) for ids in current]
        for req_id, before in computed.items():
            r = self.requests[req_id]
            if not r.hashes[0]:
                continue
            # Computed by the end of this step; only the prompt's full chunks are stored.
            done = min(before + scheduler_output.num_scheduled_tokens.get(req_id, 0), len(r.prompt))
            save = r.tracker.next_save(done)
            if save is None:
                continue
            parts = self._save_parts(r, save.begin, save.end, before,
                                     before + scheduler_output.num_scheduled_tokens.get(req_id, 0),
                                     None if block_state is None else (offers or {}).get(req_id, ()))
            # Best effort, as a cache is: a save that fails is a later miss,
            # so the next chunks are planned without waiting for its outcome.
            r.tracker.save_settled(bool(parts))
            if parts:
                if self.cfg.tier_events == "server":
                    for part in parts:
                        group = self.cfg.groups[part.group]
                        part.chunk_events = describe_chunks(r.source, part.begin, part.end, self.cfg.block_size,
                                                            self.cfg.chunk_tokens, group.index, spec_fields(group),
                                                            self.cfg.hash_block_size)
                job = SaveJob(req_id, save.begin, save.end, parts, self.next_save_id)
                self.next_save_id += 1
                meta.saves.append(job)
                r.saves_posted = True
                if self.events is not None:
                    for part in parts:
                        self.events.save_posted(job.save_id, part.group, r.source, part.begin, part.end,
                                                part.chunk_hashes)
        return meta

    def update_connector_output(self, connector_output):
        """The workers' step outputs, summed: a load whose blocks came back
        invalid, or that failed (failed_recving), counts against its
        request; finished_recving ends it; finished_sending hands a
        finished request's blocks back."""
        self.freeing -= set(getattr(connector_output, "finished_sending", None) or ())
        invalid = set(getattr(connector_output, "invalid_block_ids", None) or ())
        failed = set(getattr(connector_output, "failed_recving", None) or ())  # newer vLLM: per request
        for r in self.requests.values():
            if r.load_blocks and (invalid & r.load_blocks or r.id in failed):
                r.load_failures += 1
                r.load_blocks = set()  # counted once
        for req_id in getattr(connector_output, "finished_recving", None) or ():
            r = self.requests.get(req_id)
            if r is not None:
                r.load_blocks = None
        events = getattr(connector_output, "kv_cache_events", None)
        if self.events is not None and isinstance(events, KvstrandKVEvents):
            for record in events.get_all_events():
                self.events.save_ended(record)

    def take_events(self):
        return self.events.take() if self.events is not None else []

    def request_finished(self, request, block_ids):
        r = self.requests.pop(request.request_id, None)
        if r is None:
            return False, None
        # A lookup still posted gives its lease back when its answer arrives
        # (_drain finds no request for it).
        self._release(r)
        if r.load_blocks is not None:
            # Aborted while its load is in flight: vLLM keeps the blocks until
            # finished_recving on its own; True would report it twice.
            return False, None
        if r.saves_posted:  # a save may still read its blocks
            self.delayed_free.add(r.id)  # the workers free it through get_finished
            self.freeing.add(r.id)
            return True, None
        return False, None

    def has_pending_block_frees(self):
        """Whether blocks vLLM waits for will come back without preempting
        anyone: a finished request's, once its saves end (finished_sending)."""
        return bool(self.freeing)

    def reset_cache(self):
        """Stops reading and writing what this engine stored: later requests'
        keys start a new epoch. The node tier's entries stay for other engines
        and leave by eviction, unless drop_on_reset says to drop the model's
        namespaces on the node (an online weight update of every engine
        there): then they are freed now, for every engine. A drop that
        fails (a server before protocol 2.3, or none answering) is logged:
        the new epoch already keeps this engine from the old entries."""
        self.epoch += 1
        if self.events is not None:
            self.events.forget_all()
        if self.cfg.drop_on_reset:
            try:
                dropped = sum(self.conn.invalidate(self.registrations[(0, g)]) for g in range(self.ngroups))
                log.info("kvstrand.vllm: reset_cache dropped %d objects of this model from the node tier", dropped)
            except kvstrand.TransferRefused as e:
                log.warning("kvstrand.vllm: reset_cache could not drop the node tier's objects (%s); this engine "
                            "reads none of them again all the same", e)
        return True

    def shutdown(self):
        self.conn.close()
