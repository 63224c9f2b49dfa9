"""A miniature of vLLM's engine core, for driving kvstrand.vllm through vLLM's
own request and block bookkeeping (vLLM cannot be installed here).

Written for kvstrand from reading vLLM's source, not copied from it: the
scheduler of vllm/v1/core/sched/scheduler.py at commit 00024d3, the
connector interface of .../kv_connector/v1/base.py at 003df29, and the worker
call order of vllm/v1/worker/kv_connector_model_runner_mixin.py. What it
keeps of vLLM, each a place where a connector's bugs hide:

- The running loop first, preempting the last running request when blocks
  run out (its blocks freed and reused in the same step); then the waiting
  loop: remote-KV waiters, the local hit, the connector's answer (None: try
  again next step), allocation, update_state_after_alloc, async loads that
  hold their blocks in WAITING_FOR_REMOTE_KVS.
- update_from_output: failed loads (invalid blocks) under both load-failure
  policies, "recompute" freeing a request whose load failed from its first
  block so that it is looked up again; finished_recving and finished_sending
  with vLLM's assertions; finish_requests (aborts) with vLLM's own delay of
  a request waiting for remote KV.
- The worker: bind_connector_metadata, handle_preemptions, start_load_kv
  before the forward pass (older vLLM) or after it (newer), wait_for_save
  (after a draft model's forward under speculative decoding), get_finished,
  get_block_ids_with_load_errors, get_kv_connector_stats,
  clear_connector_metadata; an id counts as finished once every worker said
  so (vLLM's KVOutputAggregator).

The block pool and KV cache manager are in mini_vllm_blocks.py, the toy
model, requests and configurations in mini_vllm_model.py (re-exported here).

It follows one picture of vLLM (PICTURE, from KVSTRAND_VLLM_PICTURE, as
conftest.py installs it; tests/python/vllm_pictures/README.md):
- "oldest" (v0.18): the workers report loads through get_finished and failed
  ones by block ids, whose recovery path reads one KV-cache group and raises
  on more (hybrid_invalid_blocks=False; True stands for a vLLM that handles
  every group); with Mamba groups the scheduler asserts that no external KV
  is loaded (mamba_external_assert, vLLM issue #39702).
- "newest" (main at 00f4240): handle_preemptions before bind; the workers'
  get_transfer_results, failed loads per request (failed_recving, freed and
  looked up again), block ids refused under several groups (RuntimeError,
  as vLLM's _handle_invalid_blocks); no Mamba assert; a Mamba state at a
  block boundary written to a copy-on-write block that replaces the table's
  entry at the step's end, handed to the connector in
  kv_connector_block_state; has_pending_block_frees asked before a
  preemption; stats shipped through to_dict()."""

import pickle
import time
from collections import defaultdict
from types import SimpleNamespace

import kvstrand
from kvstrand.vllm import KvstrandConnector, KVConnectorRole
from mini_vllm_blocks import BlockPool, KVCacheManager
# The toy model, requests and configurations, re-exported for the tests.
from mini_vllm_model import (
    BLOCK, FakeStateTensor, FakeTensor, HEAD, HEADS, HybridAttentionTensor, MambaSpec, NEWEST, NULL, PICTURE,
    Request, Status, ToyModelChecks, block_hashes, configs, hybrid_strides, kv_offset, kv_shape, token_for,
)


class MiniVllm(ToyModelChecks):
    def __init__(self, socket, tp=1, num_blocks=64, layers=2, chunk_tokens=64, stream_provider=None, groups=None,
                 order="new", policy="recompute", hybrid_invalid_blocks=False, spec_tokens=0, budget=64,
                 caching=True, max_running=16, planes=2, tensor=FakeTensor, state_tensor=FakeStateTensor,
                 hybrid_tensor=None, mamba_external_assert=not NEWEST, **extra):
        """`tensor(planes, num_blocks)` makes a layer's KV cache: an object with
        write/read (above) whose `tensor` attribute, or itself, is what
        register_kv_caches is given; `state_tensor(num_blocks, page)` a Mamba
        layer's (FakeStateTensor's write/read); `hybrid_tensor(planes,
        num_blocks)` an attention layer's where Mamba groups share its pages
        (default HybridAttentionTensor with FakeTensor)."""
        if planes != 2:
            extra["planes_per_layer"] = planes
        vllm_config, kv_cache_config = configs(socket, tp, num_blocks, layers, chunk_tokens, groups=groups,
                                               policy=policy, spec_tokens=spec_tokens, **extra)
        self.vllm_config, self.kv_cache_config = vllm_config, kv_cache_config
        self.scheduler = KvstrandConnector(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config)
        self.hma = len(kv_cache_config.kv_cache_groups) > 1
        self.workers, self.caches = [], []
        if planes == 2 and any(isinstance(g.kv_cache_spec, MambaSpec) for g in kv_cache_config.kv_cache_groups):
            # vLLM's hybrid layout: attention shares pages with Mamba state
            tensor = hybrid_tensor or (HybridAttentionTensor if tensor is FakeTensor else tensor)
        for rank in range(tp):
            w = KvstrandConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config, tp_rank=rank,
                                  stream_provider=stream_provider)
            caches = [[state_tensor(num_blocks, g.kv_cache_spec.page_size_bytes)
                       if isinstance(g.kv_cache_spec, MambaSpec) else tensor(planes, num_blocks)
                       for _ in g.layer_names] for g in kv_cache_config.kv_cache_groups]
            w.register_kv_caches({name: getattr(t, "tensor", t) for g, ts in zip(kv_cache_config.kv_cache_groups, caches)
                                  for name, t in zip(g.layer_names, ts)})
            self.workers.append(w)
            self.caches.append(caches)
        windows = [int(getattr(g.kv_cache_spec, "sliding_window", 0) or 0) for g in kv_cache_config.kv_cache_groups]
        self.mamba = [g for g, group in enumerate(kv_cache_config.kv_cache_groups)
                      if isinstance(group.kv_cache_spec, MambaSpec)]
        self.kv = KVCacheManager(num_blocks, windows, caching, self.mamba)
        self.mamba_external_assert = mamba_external_assert
        self.num_blocks, self.tp, self.order, self.budget = num_blocks, tp, order, budget
        self.recompute = policy == "recompute"
        self.hybrid_invalid_blocks = hybrid_invalid_blocks
        self.spec_tokens, self.max_running = spec_tokens, max_running
        self.requests, self.waiting, self.running = {}, [], []
        self.finished_req_ids = set()             # since the last step
        self.finished_recving_kv_req_ids, self.failed_recving_kv_req_ids = set(), set()
        self.failed_pending = set()               # aggregator: failed_recving awaiting every worker's finish
        self.preempt_next = set()                 # a test's wish: preempt these at the next step
        self.announce_preemptions = True          # False: preempted_req_ids stays empty, as in some versions
        self.meta_hook = None                     # a test may alter the metadata in flight
        self.counts = defaultdict(lambda: [0, 0])  # aggregator: id -> [sending, recving] reports
        self.stats = defaultdict(int)
        self.connector_stats = []                 # what vLLM would log
        self.published = []                       # KV events vLLM would publish
        self.done, self.errored = [], []
        self.mismatched = []                      # where check() found the wrong KV
        self.cow = {}                             # (request, Mamba group) -> (index, block) replacing it this step
        self.offered = []                         # every (group, block, tokens) handed to the connector
        self.waited_for_frees = 0                 # steps a preemption waited for the connector's frees

    # ---- the API server's calls ----
    def add(self, req_id, prompt, max_tokens=2, **keys):
        req = Request(req_id, prompt, max_tokens, **keys)
        self.requests[req_id] = req
        self.waiting.append(req)
        return req

    def abort(self, req_id):
        self.finish_requests([req_id], Status.FINISHED_ABORTED)

    # ---- vLLM's scheduler ----
    def finish_requests(self, ids, status):
        for req_id in ids:
            req = self.requests.get(req_id)
            if req is None or req.is_finished():
                continue
            if req in self.running:
                self.running.remove(req)
            elif req in self.waiting:
                self.waiting.remove(req)
            delay = False
            if req.status == Status.WAITING_FOR_REMOTE_KVS:  # vLLM keeps it until its load ends
                delay = req_id not in self.finished_recving_kv_req_ids
                self.finished_recving_kv_req_ids.discard(req_id)
                self.failed_recving_kv_req_ids.discard(req_id)
            req.status = status
            self._free_request(req, delay)

    def _free_request(self, req, delay=False):
        assert req.is_finished()
        self.kv.remove_skipped_blocks(req.request_id, req.num_tokens)
        block_ids = self.kv.get_block_ids(req.request_id)
        if self.hma:
            connector_delay, _ = self.scheduler.request_finished_all_groups(req, block_ids)
        else:
            connector_delay, _ = self.scheduler.request_finished(req, block_ids[0])
        self.finished_req_ids.add(req.request_id)
        if not (delay or connector_delay):
            self._free_blocks(req)

    def _free_blocks(self, req):
        assert req.is_finished()
        self.kv.free(req)
        del self.requests[req.request_id]

    def _preempt(self, req):
        assert req.status == Status.RUNNING
        self.kv.free(req)
        req.status = Status.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.insert(0, req)

    def _update_waiting_for_remote_kv(self, req):
        if req.request_id not in self.finished_recving_kv_req_ids:
            return False
        if req.request_id in self.failed_recving_kv_req_ids:
            if req.num_computed_tokens:
                self.kv.cache_blocks(req, req.num_computed_tokens)
            else:
                self.kv.free(req)  # asked again: a local hit or the connector
            self.failed_recving_kv_req_ids.remove(req.request_id)
        else:
            full = next(ids for g, ids in enumerate(self.kv.get_block_ids(req.request_id))
                        if g not in self.mamba)  # an attention group covers the whole prefix
            n = min(len(full) * BLOCK, req.num_tokens)
            if n == req.num_tokens:
                n -= 1
            self.kv.cache_blocks(req, n)
            req.num_computed_tokens = n
            self.stats["resumed"] += 1
            self.stats["loaded_tokens"] += req.loaded[1] - req.loaded[0]
            self.stats["mismatches"] += self.check(req, *req.loaded) + self.check_state(req, req.loaded[1])
        self.finished_recving_kv_req_ids.remove(req.request_id)
        return True

    def schedule(self):
        budget = self.budget
        new_reqs, resumed, running, preempted = [], [], [], []
        new_blocks, num_scheduled = {}, {}
        for req_id in self.preempt_next:  # a test forcing what running out of blocks would do
            req = self.requests[req_id]
            self.running.remove(req)
            self._preempt(req)
            preempted.append(req)
        self.preempt_next = set()
        lookahead = self.spec_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = self._mamba_block_aligned_split(req, min(req.num_tokens - req.num_computed_tokens, budget))
            if n <= 0:
                i += 1
                continue
            while True:
                blocks = self.kv.allocate_slots(req, n, num_lookahead_tokens=lookahead)
                if blocks is not None:
                    break
                if NEWEST and self.scheduler.has_pending_block_frees():
                    self.waited_for_frees += 1  # blocks come back without preempting anyone: wait
                    break
                victim = self.running.pop()  # the last running request
                self._preempt(victim)
                preempted.append(victim)
                self.stats["preempted"] += 1
                if victim is req:
                    break
            if blocks is None:
                break
            running.append(req)
            new_blocks[req.request_id] = blocks
            num_scheduled[req.request_id] = n
            budget -= n
            i += 1
        if not preempted:
            skipped = []
            while self.waiting and budget > 0 and len(self.running) < self.max_running:
                req = self.waiting[0]
                if req.status == Status.WAITING_FOR_REMOTE_KVS:
                    if self._update_waiting_for_remote_kv(req):
                        req.status = Status.PREEMPTED if req.num_preemptions else Status.WAITING
                    else:
                        skipped.append(self.waiting.pop(0))
                        continue
                ext, load_async = 0, False
                if req.num_computed_tokens == 0:
                    hit_blocks, local = self.kv.get_computed_blocks(req)
                    ext, load_async = self.scheduler.get_num_new_matched_tokens(req, local)
                    if ext is None:
                        self.stats["not_known_yet"] += 1
                        skipped.append(self.waiting.pop(0))
                        continue
                    assert load_async or ext == 0, "kvstrand.vllm loads asynchronously"
                    req.num_external_computed_tokens = ext
                    computed = local + ext
                else:
                    hit_blocks, local, computed = None, 0, req.num_computed_tokens
                n = self._mamba_block_aligned_split(req, min(req.num_tokens - computed, budget), local, ext)
                if load_async:
                    n = 0
                elif n == 0:  # no whole block fits the budget: a later step
                    break
                blocks = self.kv.allocate_slots(req, n, local, hit_blocks,
                                                0 if req.num_computed_tokens == 0 else lookahead, ext,
                                                delay_cache_blocks=load_async)
                if blocks is None:
                    break
                self.scheduler.update_state_after_alloc(req, self.kv.get_blocks(req.request_id), ext)
                self.waiting.pop(0)
                if load_async:
                    req.loaded = (local, local + ext)
                    req.status = Status.WAITING_FOR_REMOTE_KVS
                    skipped.append(req)
                    continue
                self.running.append(req)
                (new_reqs if req.status == Status.WAITING else resumed).append(req)
                new_blocks[req.request_id] = self.kv.get_blocks(req.request_id)
                num_scheduled[req.request_id] = n
                budget -= n
                req.status = Status.RUNNING
                req.num_computed_tokens = computed
                if req.num_cached_tokens < 0:
                    req.num_cached_tokens = computed
            self.waiting[0:0] = skipped
        cached = running + resumed
        output = SimpleNamespace(
            scheduled_new_reqs=[SimpleNamespace(req_id=r.request_id, prompt_token_ids=r.prompt_token_ids,
                                                block_ids=new_blocks[r.request_id].get_block_ids(),
                                                num_computed_tokens=r.num_computed_tokens) for r in new_reqs],
            scheduled_cached_reqs=SimpleNamespace(
                req_ids=[r.request_id for r in cached], resumed_req_ids={r.request_id for r in resumed},
                new_block_ids=[new_blocks[r.request_id].get_block_ids(allow_none=True) for r in cached],
                num_computed_tokens=[r.num_computed_tokens for r in cached]),
            num_scheduled_tokens=num_scheduled, total_num_scheduled_tokens=sum(num_scheduled.values()),
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids={r.request_id for r in preempted} if self.announce_preemptions else set())
        if NEWEST:
            output.kv_connector_block_state = self._block_state(num_scheduled)
        output.kv_connector_metadata = self.scheduler.build_connector_meta(output)
        for req_id, n in num_scheduled.items():  # _update_after_schedule
            self.requests[req_id].num_computed_tokens += n
        self.finished_req_ids = set()
        return output

    def _block_state(self, num_scheduled):
        """vLLM's KVConnectorBlockState for this step: each scheduled
        request's table as it is now, and the Mamba states handed over. A
        step that ends on a block boundary writes each Mamba group's state
        into a copy-on-write block, which replaces the table's entry at the
        step's end (_apply_cow); the block the connector was shown before
        for that position is then freed."""
        offers = defaultdict(list)
        for req_id, n in num_scheduled.items():
            req = self.requests[req_id]
            end = req.num_computed_tokens + n
            if not self.mamba or end % BLOCK or end > req.num_prompt_tokens:
                continue
            for g in self.mamba:
                if self.kv.pool.num_free() == 0:
                    break
                c = self.kv.pool.take()
                self.cow[(req_id, g)] = (end // BLOCK - 1, c)
                offers[req_id].append((g, c, end))
                self.offered.append((g, c, end))
        return SimpleNamespace(block_ids={r: self.kv.get_block_ids(r) for r in num_scheduled},
                               boundary_state_offloads=dict(offers))

    def _apply_cow(self):
        """The step's copy-on-write blocks take their table entries (and the
        prefix cache's), and the blocks they replace are freed."""
        pool = self.kv.pool
        for (req_id, g), (i, c) in self.cow.items():
            ids = self.kv.blocks.get(req_id)
            if ids is None or i >= len(ids[g]):
                pool.release(c)
                continue
            old, ids[g][i] = ids[g][i], c
            if old in pool.hash_of:
                key = pool.hash_of.pop(old)
                pool.cached[key], pool.hash_of[c] = c, key
            pool.release(old)
        self.cow = {}

    def _mamba_block_aligned_split(self, req, n, local=0, ext=0):
        """Scheduler._mamba_block_aligned_split: a prefill step ends on the
        block grid, and the prompt's last whole block is a step end."""
        if not self.mamba:
            return n
        if self.mamba_external_assert:
            assert ext == 0, "External KV connector is not verified yet"
        computed = req.num_computed_tokens + local + ext
        if computed < max(req.num_prompt_tokens, req.num_tokens - 1):
            last = req.num_tokens - req.num_tokens % BLOCK
            if self.spec_tokens:  # EAGLE drops the last matched block
                last = max(last - BLOCK, 0)
            if computed + n < last:
                n = n // BLOCK * BLOCK
            elif computed < last < computed + n:
                n = last - computed
        return n

    # ---- the workers ----
    def execute(self, output):
        meta = pickle.loads(pickle.dumps(output.kv_connector_metadata))  # to the worker processes
        if self.meta_hook:
            meta = self.meta_hook(meta) or meta
        sending, recving, invalid, events = set(), set(), set(), None
        for rank, w in enumerate(self.workers):
            if NEWEST:  # the model runner handles preemptions before it binds the step's metadata
                w.handle_preemptions(meta)
                w.bind_connector_metadata(meta)
            else:
                w.bind_connector_metadata(meta)
                w.handle_preemptions(meta)
            if self.order == "old":
                w.start_load_kv(None)
            for req_id, n in output.num_scheduled_tokens.items():
                req = self.requests[req_id]
                self.forward(rank, req, req.num_computed_tokens - n, req.num_computed_tokens)
            for layer in self.kv_cache_config.kv_cache_groups[0].layer_names:
                w.wait_for_layer_load(layer)
                w.save_kv_layer(layer, None, None)
            if self.order == "new":
                w.start_load_kv(None)
            # Under speculative decoding the newer order defers wait_for_save
            # (and clearing the metadata) past the draft model's forward pass,
            # after this step's get_finished.
            deferred = self.order == "new" and self.spec_tokens > 0
            if not deferred:
                w.wait_for_save()
            if NEWEST:
                results = w.get_transfer_results(output.finished_req_ids)
                s, r = results.finished_sending, results.finished_recving
                self.failed_pending |= results.failed_recving
            else:
                s, r = w.get_finished(output.finished_req_ids)
            for req_id in s or ():
                self.counts[req_id][0] += 1
            for req_id in r or ():
                self.counts[req_id][1] += 1
            invalid |= w.get_block_ids_with_load_errors()
            stats = w.get_kv_connector_stats()
            if stats is not None:
                self.connector_stats.append(stats)
            ev = w.get_kv_connector_kv_cache_events()
            if ev is not None:  # KVOutputAggregator: the first worker's container, the others' merged in
                ev = pickle.loads(pickle.dumps(ev))  # from the worker process
                if events is None:
                    events = ev
                else:
                    events.add_events(ev.get_all_events())
                    events.increment_workers(ev.get_number_of_workers())
            if deferred:  # the draft model's forward pass ran here
                w.wait_for_save()
            w.clear_connector_metadata()
        for req_id, (s, r) in list(self.counts.items()):  # KVOutputAggregator: every worker said so
            if s == self.tp:
                sending.add(req_id)
                self.counts[req_id][0] = 0
            if r == self.tp:
                recving.add(req_id)
                self.counts[req_id][1] = 0
        failed = self.failed_pending & recving  # KVOutputAggregator: reported with the request's end
        self.failed_pending -= failed
        return SimpleNamespace(finished_sending=sending, finished_recving=recving, invalid_block_ids=invalid,
                               failed_recving=failed, kv_cache_events=events)

    def _invalid_blocks(self, invalid):
        """vLLM's _handle_invalid_blocks for async loads."""
        failed = set()
        if NEWEST and self.hma:
            raise RuntimeError("A KV connector reported block-level load failures (invalid_block_ids) which is not "
                               "supported for models with multiple KV cache groups")
        for req in [r for r in self.waiting if r.status == Status.WAITING_FOR_REMOTE_KVS]:
            groups = self.kv.get_block_ids(req.request_id)
            if not self.hybrid_invalid_blocks:
                (ids,) = groups  # vLLM at 00024d3 reads one group: several raise here, as there
                groups = (ids,)
            computed = (req.num_computed_tokens if req.request_id in self.failed_recving_kv_req_ids
                        else len(groups[0]) * BLOCK)
            first = None
            for ids in groups:
                for i, b in enumerate(ids[:-(-computed // BLOCK)]):
                    if b in invalid and b != NULL:
                        first = i if first is None else min(first, i)
                        break
            if first is not None:
                self.stats["load_errors"] += 1
                req.num_computed_tokens = first * BLOCK
                failed.add(req.request_id)
        if failed and not self.recompute:
            return failed
        self.failed_recving_kv_req_ids |= failed
        return set()

    def _failed_recving(self, ids):
        """vLLM's _handle_failed_recving: a failed load's request computes
        from 0 under "recompute" (its blocks freed once its load ends)."""
        affected = set()
        for req_id in ids:
            req = self.requests.get(req_id)
            if req is not None and req.status == Status.WAITING_FOR_REMOTE_KVS:
                self.stats["load_errors"] += 1
                affected.add(req_id)
                if self.recompute:
                    req.num_computed_tokens = 0
                    self.failed_recving_kv_req_ids.add(req_id)
        return set() if self.recompute else affected

    def update_from_output(self, output, kv_out):
        self._apply_cow()
        failed = self._failed_recving(getattr(kv_out, "failed_recving", ()))
        failed |= self._invalid_blocks(kv_out.invalid_block_ids) if kv_out.invalid_block_ids else set()
        for req_id in output.num_scheduled_tokens:
            req = self.requests.get(req_id)
            if req is None or req.is_finished():
                continue
            if req.num_computed_tokens >= req.num_tokens:  # a token is sampled
                req.output_token_ids.append(token_for(req))
                if len(req.output_token_ids) >= req.max_tokens:
                    self.stats["mismatches"] += self.check(req, 0, req.num_computed_tokens // BLOCK * BLOCK)
                    self.running.remove(req)
                    req.status = Status.FINISHED_STOPPED
                    self.done.append(req_id)
                    self._free_request(req)
        if failed:  # policy "fail": the user's request ends in an error
            self.errored.extend(sorted(failed))
            self.finish_requests(failed, Status.FINISHED_ERROR)
        # _update_from_kv_xfer_finished, with vLLM's assertions
        self.scheduler.update_connector_output(kv_out)
        for req_id in kv_out.finished_recving:
            assert req_id in self.requests, f"finished_recving for unknown request {req_id}"
            req = self.requests[req_id]
            if req.status == Status.WAITING_FOR_REMOTE_KVS:
                self.finished_recving_kv_req_ids.add(req_id)
            else:
                assert req.is_finished()
                self._free_blocks(req)
        for req_id in kv_out.finished_sending:
            assert req_id in self.requests, f"finished_sending for unknown request {req_id}"
            self._free_blocks(self.requests[req_id])
        stats = self.scheduler.get_kv_connector_stats()
        if stats is not None:
            self.connector_stats.append(stats)
        self.published.extend(self.scheduler.take_events())  # vLLM's KVEventBatch, published

    def step(self):
        output = self.schedule()
        self.update_from_output(output, self.execute(output))
        time.sleep(0.001)  # the rest of a real step; lookups and copies proceed meanwhile

    def idle(self):
        return not self.requests

    def run(self, until=None, timeout=30.0):
        """Steps until `until()` (default: every request ended and its blocks
        freed), at most `timeout` seconds."""
        until = until or self.idle
        end = time.monotonic() + timeout
        while not until():
            if time.monotonic() > end:
                raise AssertionError(f"not done after {timeout} s: {len(self.waiting)} waiting "
                                     f"{[(r.request_id, r.status.name) for r in self.waiting]}, running "
                                     f"{[r.request_id for r in self.running]}, "
                                     f"held {[k for k, r in self.requests.items() if r.is_finished()]}")
            self.step()

    def held(self):
        """Finished requests whose blocks vLLM still holds (the connector's)."""
        return {k for k, r in self.requests.items() if r.is_finished()}

    def all_blocks_free(self):
        """Every block back in the pool exactly once (BlockPool asserts on a double free)."""
        return self.kv.pool.num_free() == self.num_blocks - 1 and not any(self.kv.pool.ref)

    def summed_stats(self):
        total = None
        for s in self.connector_stats:
            total = s if total is None else total.aggregate(s)
        if total is not None and NEWEST:  # the scheduler ships them as to_dict(); the logger rebuilds them
            total = type(self.scheduler).build_kv_connector_stats(total.to_dict())
        return total.reduce() if total is not None else {}

    def shutdown(self):
        for c in [self.scheduler, *self.workers]:
            c.shutdown()
