"""The scheduler side of kvstrand.vllm: looks prompts up in the node tier,
plans what to load (plan_hit) and what to save (SaveTracker), and hands each
TP rank's lease to the workers through the step's metadata.

The scheduler has no device memory: its Connector registers one lookup-only
registration per TP rank (each rank's keys carry its rank). Lookups are
posted, never waited for: get_num_new_matched_tokens answers None ("not
known yet") until every rank's answer has arrived.
"""

import logging

import kvstrand

from .metadata import KvstrandConnectorMetadata, LoadJob, SaveJob

log = logging.getLogger("kvstrand.vllm")


class _Request:
    def __init__(self, req_id, prompt, hashes, chunk_tokens):
        self.id = req_id
        self.prompt = prompt
        self.hashes = hashes               # one per full chunk of the prompt
        self.lookups = {}                  # TP rank -> lookup id, while posted
        self.answers = {}                  # TP rank -> LookupOutcome (its lease held until handed off or released)
        self.matched = None                # (num_computed_tokens, tokens to load) last answered
        self.load_decided = False
        self.block_ids = []
        self.tracker = kvstrand.SaveTracker(chunk_tokens)
        self.transfers = False             # a save or a load of it went to the workers


class SchedulerSide:
    def __init__(self, cfg):
        self.cfg = cfg
        self.conn = kvstrand.Connector(cfg.connector_options())
        self.layouts = [cfg.layout(rank) for rank in range(cfg.tp_size)]
        for layout in self.layouts:
            kvstrand.validate(layout)
        # One lookup-only registration per rank: id == rank.
        self.groups = [self.conn.register_layout(kvstrand.Registration(layout)) for layout in self.layouts]
        self.namespace = kvstrand.namespace_of(self.layouts[0])
        self.ranks_of_key = [kvstrand.kv_rank_of(layout) for layout in self.layouts]
        self.requests = {}
        self.by_lookup = {}                # lookup id -> (request id, rank)
        self.loads = []                    # LoadJobs for the next metadata
        self.delayed_free = set()

    # ---- helpers ----
    def _request(self, request):
        r = self.requests.get(request.request_id)
        if r is None:
            prompt = list(request.prompt_token_ids or [])
            hashes = kvstrand.chunk_hashes(self.namespace, prompt, self.cfg.chunk_tokens)
            r = self.requests[request.request_id] = _Request(request.request_id, prompt, hashes, self.cfg.chunk_tokens)
        return r

    def _drain(self):
        for answer in self.conn.finished().lookups:
            req_id, rank = self.by_lookup.pop(answer.id)
            r = self.requests.get(req_id)
            if r is None or r.lookups.get(rank) != answer.id:  # finished meanwhile
                if answer.lease:
                    self.conn.release_lookup(answer.lease)
                continue
            del r.lookups[rank]
            r.answers[rank] = answer

    def _release(self, r):
        for answer in r.answers.values():
            if answer.lease:
                self.conn.release_lookup(answer.lease)
        r.answers = {}

    def _readmit(self, r):
        stored = r.tracker.frontier
        r.tracker = kvstrand.SaveTracker(self.cfg.chunk_tokens)
        r.tracker.note_stored(stored)
        r.load_decided, r.matched = False, None

    def _post_lookups(self, r):
        for rank, group in enumerate(self.groups):
            keys = [kvstrand.ChunkKey(self.namespace, self.ranks_of_key[rank], h) for h in r.hashes]
            try:
                lookup = self.conn.lookup(keys, group)
            except kvstrand.TransferRefused as e:
                if e.code != kvstrand.TransferErrc.too_many_live:
                    raise
                return False  # asked again at the next call
            r.lookups[rank] = lookup
            self.by_lookup[lookup] = (r.id, rank)
        return True

    # ---- vLLM's calls ----
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        r = self._request(request)
        if r.load_decided:
            # vLLM asks again only for a request it preempted and now admits
            # afresh: the tier still holds what was saved of it, so look it
            # up again (the workers fenced its transfers at the preemption).
            self._readmit(r)
        if len(r.hashes) == 0:
            return 0, False
        self._drain()
        if not r.answers and not r.lookups and not self._post_lookups(r):
            return None, False
        if r.lookups:
            return None, False  # not known yet: vLLM asks again at a later step
        # Every rank must hold the prefix: the hit is the least of theirs. A
        # hit the server did not lease (its per-client bound) cannot be handed over.
        hit = min(a.hit.tokens if a.lease else 0 for a in r.answers.values())
        plan = kvstrand.plan_hit(self.layouts[0], prompt_tokens=len(r.prompt),
                                 hbm=kvstrand.HitSource(num_computed_tokens), tier=kvstrand.HitSource(hit),
                                 min_load_tokens=self.cfg.min_load_tokens)
        n = 0
        if plan.load is not None and plan.load.begin == num_computed_tokens:
            n = plan.frontier - num_computed_tokens
        r.matched = (num_computed_tokens, n)
        return n, n > 0

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        r = self._request(request)
        r.block_ids = list(blocks.get_block_ids()[0])
        if r.load_decided:
            return  # the second call, after the load: blocks only
        if num_external_tokens > 0 and r.matched and r.matched[1] == num_external_tokens and \
                len(r.answers) == len(self.groups):
            begin = r.matched[0]
            end = begin + num_external_tokens
            bs, ct = self.cfg.block_size, self.cfg.chunk_tokens
            handoff = {rank: self.conn.export_lease(a.lease) for rank, a in r.answers.items()}
            r.answers = {}  # the leases are the workers' now
            self.loads.append(LoadJob(r.id, begin, end, r.block_ids[begin // bs:end // bs],
                                      r.hashes[begin // ct:-(-end // ct)], handoff))
            r.load_decided = True
            r.transfers = True
            r.tracker.load_decided(kvstrand.TokenRange(begin, end))
            # What it loads is stored already, whether or not the copy lands.
            r.tracker.load_settled(kvstrand.LoadOutcome.landed)
            return
        if r.answers:
            r.tracker.note_stored(min(a.hit.tokens for a in r.answers.values()))
        self._release(r)
        r.tracker.spend_tier_attempt()
        r.load_decided = True

    def build_connector_meta(self, scheduler_output):
        self._drain()  # every step: an answer for a request finished meanwhile gives its lease back now
        meta = KvstrandConnectorMetadata(namespace=self.namespace, loads=self.loads, delayed_free=self.delayed_free,
                                         preempted=set(getattr(scheduler_output, "preempted_req_ids", None) or ()))
        self.loads, self.delayed_free = [], set()
        # Blocks given out this step to be written (not those a prefix-cache
        # hit only reads). vLLM may not say which requests it preempted
        # (preempted_req_ids is empty in some versions); a worker whose save
        # still reads one of these fences it before the forward pass.
        bs = self.cfg.block_size
        for job in meta.loads:
            meta.allocated.update(job.block_ids)
        computed = {}
        for new in scheduler_output.scheduled_new_reqs:
            meta.allocated.update(new.block_ids[0][new.num_computed_tokens // bs:])
            r = self.requests.get(new.req_id)
            if r is not None:
                r.block_ids = list(new.block_ids[0])
                computed[r.id] = new.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", None) or ())
        for i, req_id in enumerate(cached.req_ids):
            new_ids = cached.new_block_ids[i]
            if new_ids:  # a resumed request's list is whole: its prefix-cache part is only read
                first = cached.num_computed_tokens[i] // bs if req_id in resumed else 0
                meta.allocated.update(new_ids[0][first:])
            r = self.requests.get(req_id)
            if r is None:
                continue
            if req_id in resumed:
                r.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                r.block_ids.extend(new_ids[0])
            computed[req_id] = cached.num_computed_tokens[i]
        for req_id, before in computed.items():
            r = self.requests[req_id]
            # Computed by the end of this step; only the prompt's full chunks are stored.
            done = min(before + scheduler_output.num_scheduled_tokens.get(req_id, 0), len(r.prompt))
            save = r.tracker.next_save(done)
            if save is None:
                continue
            ct = self.cfg.chunk_tokens
            if save.end // bs > len(r.block_ids):
                r.tracker.save_settled(False)
                continue
            meta.saves.append(SaveJob(req_id, save.begin, save.end, r.block_ids[save.begin // bs:save.end // bs],
                                      r.hashes[save.begin // ct:save.end // ct]))
            # Best effort, as a cache is: a save that fails is a later miss,
            # so the next chunks are planned without waiting for its outcome.
            r.tracker.save_settled(True)
            r.transfers = True
        return meta

    def request_finished(self, request, block_ids):
        r = self.requests.pop(request.request_id, None)
        if r is None:
            return False, None
        # A lookup still posted gives its lease back when its answer arrives
        # (_drain finds no request for it).
        self._release(r)
        if r.transfers:  # a save may still read its blocks, a load (of a request aborted while loading) write them
            self.delayed_free.add(r.id)  # the workers free it through get_finished
            return True, None
        return False, None

    def shutdown(self):
        self.conn.close()
