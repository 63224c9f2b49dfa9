"""A miniature of vLLM's engine loop, for driving kvstrand.vllm through the
call order vLLM documents (vLLM cannot be installed here).

It has vLLM's shapes, not its code: requests with the fields vLLM's Request
has (request_id, prompt_token_ids, num_tokens), KVCacheBlocks with
get_block_ids(), a SchedulerOutput with scheduled_new_reqs,
scheduled_cached_reqs (resumed_req_ids), num_scheduled_tokens,
finished_req_ids and preempted_req_ids, the metadata pickled on its way to
the workers, and finished_sending/finished_recving counted over every worker
(vLLM's KVOutputAggregator). Each TP rank's KV cache is one tensor per layer
of FlashAttention's shape (2, num_blocks, block_size, heads, head_size) in
device memory (sim memory seen through numpy; DeviceMemory on a GPU), written by a toy model whose KV is a pure function of the
prompt prefix, layer, K/V and rank, so every block can be checked.
"""

import hashlib
import pickle
import time
from collections import defaultdict
from types import SimpleNamespace

import numpy as np

import kvstrand
from kvstrand.vllm import KvstrandConnector, KVConnectorRole

BLOCK, HEADS, HEAD = 16, 2, 32
ELEM = 2  # bf16


class FakeTensor:
    """What kvstrand.vllm reads of a torch.Tensor: data_ptr, shape, element_size,
    is_contiguous. Sim device memory seen through numpy, or on a GPU backend
    DeviceMemory read and written by copies."""

    def __init__(self, shape):
        self.shape = shape
        self.block_bytes = int(np.prod(shape[2:])) * ELEM
        if kvstrand.sim.available():
            self.memory = kvstrand.sim.allocate(int(np.prod(shape)) * ELEM)
            self.view = np.frombuffer(self.memory, dtype=np.uint8).reshape(shape[0], shape[1], -1)
        else:
            self.memory = kvstrand.DeviceMemory(int(np.prod(shape)) * ELEM)
            self.view = None

    def write(self, half, block, data):
        if self.view is not None:
            self.view[half, block] = data
        else:
            self.memory.write((half * self.shape[1] + block) * self.block_bytes, data)

    def read(self, half, block):
        if self.view is not None:
            return self.view[half, block]
        return np.frombuffer(self.memory.read((half * self.shape[1] + block) * self.block_bytes, self.block_bytes),
                             dtype=np.uint8)

    def data_ptr(self):
        return self.memory.address

    def element_size(self):
        return ELEM

    def is_contiguous(self):
        return True


class Blocks:
    def __init__(self, ids):
        self.ids = list(ids)

    def get_block_ids(self):
        return (list(self.ids),)


def model_kv(prompt, end, layer, half, rank):
    seed = hashlib.blake2b(np.asarray(prompt[:end], dtype=np.uint32).tobytes() + bytes([layer, half, rank]),
                           digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(seed, "little")).integers(0, 256, BLOCK * HEADS * HEAD * ELEM,
                                                                          dtype=np.uint8)


def configs(socket, tp, num_blocks, layers, chunk_tokens, **extra):
    page = 2 * BLOCK * HEADS * HEAD * ELEM
    vllm_config = SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector="KvstrandConnector", kv_role="kv_both", is_kv_producer=True,
                                           kv_connector_extra_config=dict(server_socket=socket,
                                                                          chunk_tokens=chunk_tokens, **extra)),
        cache_config=SimpleNamespace(block_size=BLOCK),
        model_config=SimpleNamespace(model="toy/llama-mini", dtype="torch.bfloat16"),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp),
        speculative_config=None)
    kv_cache_config = SimpleNamespace(
        num_blocks=num_blocks,
        kv_cache_groups=[SimpleNamespace(layer_names=[f"model.layers.{i}.self_attn.attn" for i in range(layers)],
                                         kv_cache_spec=SimpleNamespace(block_size=BLOCK, page_size_bytes=page))])
    return vllm_config, kv_cache_config


class Req:
    def __init__(self, req_id, prompt, max_tokens):
        self.vllm = SimpleNamespace(request_id=req_id, prompt_token_ids=list(prompt), num_tokens=len(prompt))
        self.id, self.prompt, self.max_tokens = req_id, list(prompt), max_tokens
        self.blocks = []
        self.computed = 0
        self.generated = 0
        self.new = True
        self.resumed = False
        self.loaded = None  # (begin, end) once a load was decided


class MiniVllm:
    def __init__(self, socket, tp=1, num_blocks=64, layers=2, chunk_tokens=64, stream_provider=None, **extra):
        vllm_config, kv_cache_config = configs(socket, tp, num_blocks, layers, chunk_tokens, **extra)
        self.scheduler = KvstrandConnector(vllm_config, KVConnectorRole.SCHEDULER, kv_cache_config)
        self.workers, self.caches = [], []
        for rank in range(tp):
            w = KvstrandConnector(vllm_config, KVConnectorRole.WORKER, kv_cache_config, tp_rank=rank,
                                  stream_provider=stream_provider)
            caches = {name: FakeTensor((2, num_blocks, BLOCK, HEADS, HEAD))
                      for name in kv_cache_config.kv_cache_groups[0].layer_names}
            w.register_kv_caches(caches)
            self.workers.append(w)
            self.caches.append(list(caches.values()))
        self.layers, self.tp = layers, tp
        self.free = list(range(num_blocks))
        self.waiting, self.remote, self.running = [], {}, {}
        self.held = {}              # finished requests whose blocks wait for finished_sending
        self.finished_ids = set()   # since the last step
        self.preempt_next = set()
        self.sending, self.recving = defaultdict(int), defaultdict(int)
        self.stats = defaultdict(int)
        self.meta_hook = None       # a test may alter the metadata in flight
        self.announce_preemptions = True  # False: preempted_req_ids stays empty, as in some vLLM versions
        self.done = []

    def add(self, req_id, prompt, max_tokens=2):
        self.waiting.append(Req(req_id, prompt, max_tokens))

    # ---- the model ----
    def forward(self, rank, req, begin, end):
        for block_end in range(begin - begin % BLOCK + BLOCK, min(end, len(req.prompt)) + 1, BLOCK):
            if block_end <= begin:
                continue
            block = req.blocks[block_end // BLOCK - 1]
            for layer, t in enumerate(self.caches[rank]):
                for half in (0, 1):
                    t.write(half, block, model_kv(req.prompt, block_end, layer, half, rank))

    def check(self, req, begin, end):
        """Counts blocks of [begin, end) that differ from the model's KV on any rank."""
        bad = 0
        for block_end in range(begin + BLOCK, end + 1, BLOCK):
            block = req.blocks[block_end // BLOCK - 1]
            for rank in range(self.tp):
                for layer, t in enumerate(self.caches[rank]):
                    for half in (0, 1):
                        bad += not np.array_equal(t.read(half, block),
                                                  model_kv(req.prompt, block_end, layer, half, rank))
        return bad

    # ---- one engine step ----
    def step(self, budget=64):
        sched = self.scheduler
        new_reqs, cached, num_scheduled = [], [], {}
        for req in list(self.running.values()):
            if req.id in self.preempt_next:
                continue
            n = min(budget, len(req.prompt) - req.computed) if req.computed < len(req.prompt) else 1
            num_scheduled[req.id] = n
            cached.append(req)
        preempted = set()
        for req_id in self.preempt_next:  # vLLM frees a preempted request's blocks and requeues it
            req = self.running.pop(req_id)
            self.free.extend(req.blocks)
            req.blocks, req.computed, req.new, req.resumed = [], 0, False, True
            self.waiting.insert(0, req)
            preempted.add(req_id)
        self.preempt_next = set()
        for req in list(self.waiting):
            if req.blocks:  # its remote KV arrived: vLLM keeps the blocks and asks the connector nothing new
                sched.update_state_after_alloc(req.vllm, Blocks(req.blocks), 0)
            else:
                n, load_async = sched.get_num_new_matched_tokens(req.vllm, req.computed)
                if n is None:
                    self.stats["not_known_yet"] += 1
                    continue
                need = -(-(len(req.prompt) + req.max_tokens) // BLOCK)
                if len(self.free) < need:
                    break
                req.blocks = [self.free.pop() for _ in range(need)]
                sched.update_state_after_alloc(req.vllm, Blocks(req.blocks), n if load_async else 0)
                if load_async and n:
                    self.waiting.remove(req)
                    req.loaded = (req.computed, req.computed + n)
                    req.computed += n
                    self.remote[req.id] = req
                    continue
            self.waiting.remove(req)
            num_scheduled[req.id] = min(budget, len(req.prompt) - req.computed)
            self.running[req.id] = req
            (cached if req.resumed else new_reqs).append(req)
        output = SimpleNamespace(
            scheduled_new_reqs=[SimpleNamespace(req_id=r.id, prompt_token_ids=r.prompt, block_ids=(list(r.blocks),),
                                                num_computed_tokens=r.computed) for r in new_reqs],
            scheduled_cached_reqs=SimpleNamespace(
                req_ids=[r.id for r in cached], resumed_req_ids={r.id for r in cached if r.resumed},
                new_block_ids=[(list(r.blocks),) if r.resumed else None for r in cached],
                num_computed_tokens=[r.computed for r in cached]),
            num_scheduled_tokens=num_scheduled, total_num_scheduled_tokens=sum(num_scheduled.values()),
            finished_req_ids=self.finished_ids, preempted_req_ids=preempted if self.announce_preemptions else set())
        for r in new_reqs + cached:
            r.new = r.resumed = False
        self.finished_ids = set()
        meta = pickle.loads(pickle.dumps(sched.build_connector_meta(output)))  # to the worker processes
        if self.meta_hook:
            meta = self.meta_hook(meta) or meta
        for rank, w in enumerate(self.workers):
            w.bind_connector_metadata(meta)
            w.handle_preemptions(meta)
            w.start_load_kv(None)
            for req_id, n in num_scheduled.items():
                req = self.running[req_id]
                self.forward(rank, req, req.computed, req.computed + n)
            for name in range(self.layers):
                w.wait_for_layer_load(str(name))
                w.save_kv_layer(str(name), None, None)
            w.wait_for_save()
            sending, recving = w.get_finished(output.finished_req_ids)
            for req_id in sending or ():
                self.sending[req_id] += 1
            for req_id in recving or ():
                self.recving[req_id] += 1
            self.errors = getattr(self, "errors", set()) | w.get_block_ids_with_load_errors()
            w.clear_connector_metadata()
        self.after_step(num_scheduled)
        time.sleep(0.001)  # the rest of a real step; lookups and copies proceed meanwhile

    def after_step(self, num_scheduled):
        for req_id, n in num_scheduled.items():
            req = self.running[req_id]
            if req.computed < len(req.prompt):
                req.computed += n
            else:
                req.generated += 1
            if req.computed >= len(req.prompt) and req.generated >= req.max_tokens:
                self.finish(req)
        for req_id in [r for r, c in self.recving.items() if c == self.tp]:  # every worker: done loading
            del self.recving[req_id]
            req = self.remote.pop(req_id, None)
            if req is None:  # aborted while it loaded: vLLM only notes the id
                continue
            failed = sorted(i for i, b in enumerate(req.blocks) if b in self.errors)
            if failed:  # vLLM recomputes from the first block that failed to load
                self.stats["load_errors"] += len(failed)
                req.computed = min(req.computed, failed[0] * BLOCK)
            else:
                self.stats["resumed"] += 1
                self.stats["loaded_tokens"] += req.loaded[1] - req.loaded[0]
                self.stats["mismatches"] += self.check(req, *req.loaded)
            self.errors -= set(req.blocks)
            self.waiting.insert(0, req)
        for req_id in [r for r, c in self.sending.items() if c == self.tp]:
            del self.sending[req_id]
            self.free.extend(self.held.pop(req_id).blocks)

    def finish(self, req):
        full = len(req.prompt) // BLOCK * BLOCK
        self.stats["mismatches"] += self.check(req, 0, full)
        del self.running[req.id]
        self.finished_ids.add(req.id)
        delay, _ = self.scheduler.request_finished(req.vllm, list(req.blocks))
        if delay:
            self.held[req.id] = req
        else:
            self.free.extend(req.blocks)
        self.done.append(req.id)

    def abort(self, req_id):
        """vLLM aborting a request waiting for its remote KV: request_finished, blocks freed or held."""
        req = self.remote.pop(req_id)
        self.finished_ids.add(req_id)
        delay, _ = self.scheduler.request_finished(req.vllm, list(req.blocks))
        if delay:
            self.held[req_id] = req
        else:
            self.free.extend(req.blocks)

    def run(self, until=None, timeout=30.0, **kw):
        """Steps until `until()` (default: every request done and freed), at most `timeout` seconds."""
        until = until or (lambda: not (self.waiting or self.remote or self.running or self.held))
        end = time.monotonic() + timeout
        while not until():
            if time.monotonic() > end:
                raise AssertionError(f"not done after {timeout} s: waiting {len(self.waiting)}, remote "
                                     f"{len(self.remote)}, running {len(self.running)}, held {len(self.held)}")
            self.step(**kw)

    def shutdown(self):
        for c in [self.scheduler, *self.workers]:
            c.shutdown()
