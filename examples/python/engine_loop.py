#!/usr/bin/env python3
"""A Python engine's step loop over kvstrand, with a toy model whose KV is a
pure function of the prompt, so every resumed request is checked byte for
byte against what recomputing it would have written.

Each step it drains finished(), plans newly answered lookups (plan_hit),
computes one prefill chunk per running request, and posts the step's loads
and saves in one submit(); a request's blocks go back to the pool only once
its transfers are terminal. Requests share a few long prefixes, so later
ones resume from what earlier ones saved. A save that fails (the server
down or restarting: tier_unavailable) gives the request's saves up: the
request goes on without the tier, and admission never waits for a server.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/engine_loop.py
    ... --server /tmp/kvstrand.sock      the node tier (kvstrand-server) instead of an embedded one;
                                         start it with --chunk-tokens 64, this loop's chunk size
    ... --server ... --describe          each save carries its chunks' descriptions (docs/events.md):
                                         a server started with --events announces them to routers

Exit status 3 when a resumed block differs from its recompute.
"""

import argparse
import hashlib
import sys
import time

import numpy as np

import kvstrand

BLOCK_TOKENS, CHUNK_TOKENS, PLANE_BYTES, POOL_BLOCKS = 16, 64, 2048, 512


class Device:
    """The engine's KV pool: two planes (K, V). On the sim backend numpy views
    of device memory; on a GPU, DeviceMemory written and read by copies."""

    def __init__(self):
        if kvstrand.sim.available():
            self.mem = [kvstrand.sim.allocate(POOL_BLOCKS * PLANE_BYTES) for _ in range(2)]
            self.view = [np.frombuffer(m, dtype=np.uint8).reshape(POOL_BLOCKS, PLANE_BYTES) for m in self.mem]
        else:
            self.mem = [kvstrand.DeviceMemory(POOL_BLOCKS * PLANE_BYTES) for _ in range(2)]
            self.view = None

    def write(self, plane, block, data):
        if self.view:
            self.view[plane][block] = data
        else:
            self.mem[plane].write(block * PLANE_BYTES, data)

    def read(self, plane, block):
        if self.view:
            return self.view[plane][block].tobytes()
        return self.mem[plane].read(block * PLANE_BYTES, PLANE_BYTES)


def model_kv(tokens, end, plane):
    """The toy model's KV for the block ending at `end`: a function of the whole prefix."""
    seed = hashlib.blake2b(np.asarray(tokens[:end], dtype=np.uint32).tobytes() + bytes([plane]),
                           digest_size=8).digest()
    return np.random.default_rng(int.from_bytes(seed, "little")).integers(0, 256, PLANE_BYTES, dtype=np.uint8)


def block_hashes(tokens):
    """The engine's own hash of each full block (chained over the prefix, as
    vLLM's are), 64-bit ints as vLLM's events carry them by default."""
    out, prev = [], b""
    for end in range(BLOCK_TOKENS, len(tokens) + 1, BLOCK_TOKENS):
        prev = hashlib.blake2b(prev + np.asarray(tokens[end - BLOCK_TOKENS:end], dtype=np.uint32).tobytes(),
                               digest_size=8).digest()
        out.append(int.from_bytes(prev, "big"))
    return out


def describe(req, chunk):
    """What the server announces of chunk `chunk` of `req` (docs/events.md):
    vLLM's BlockStored fields, msgpack-encoded."""
    import msgpack  # noqa: PLC0415 - only with --describe (Debian's python3-msgpack)
    per = CHUNK_TOKENS // BLOCK_TOKENS
    hashes = req.hashes[chunk * per:(chunk + 1) * per]
    return msgpack.packb({"block_hashes": hashes, "parent_block_hash": req.hashes[chunk * per - 1] if chunk else None,
                          "token_ids": req.tokens[chunk * CHUNK_TOKENS:(chunk + 1) * CHUNK_TOKENS],
                          "block_size": BLOCK_TOKENS, "lora_id": None, "group_idx": 0})


class Request:
    def __init__(self, rid, tokens, layout):
        self.id, self.tokens = rid, tokens
        self.keys = kvstrand.chunk_keys(layout, tokens)
        self.hashes = block_hashes(tokens)
        self.blocks = []
        self.frontier = 0          # first token not yet computed or loaded
        self.lookup = None         # lookup id while its answer is pending
        self.loading = None        # the TokenRange being loaded
        self.saves = kvstrand.SaveTracker(CHUNK_TOKENS)
        self.live = 0              # transfers posted and not yet terminal
        self.done = False


class Engine:
    def __init__(self, args):
        self.layout = kvstrand.Layout(model_id="toy-model", layout_name="toy-kv",
                                      planes=[kvstrand.Plane("k", PLANE_BYTES), kvstrand.Plane("v", PLANE_BYTES)],
                                      block_tokens=BLOCK_TOKENS, chunk_tokens=CHUNK_TOKENS, dtype="bf16")
        self.dev = Device()
        options = dict(tier_bytes=64 << 20, transfer_deadline=30.0)
        if args.server:
            options = dict(server_socket=args.server, transfer_deadline=30.0)
        self.conn = kvstrand.Connector(**options)
        self.describe = args.server is not None and args.describe
        self.group = self.conn.register_layout(kvstrand.Registration(
            self.layout, [kvstrand.PlaneMemory(m.address, POOL_BLOCKS) for m in self.dev.mem]))
        self.free = list(range(POOL_BLOCKS))
        self.by_lookup, self.active = {}, {}
        self.stats = dict(requests=0, resumed=0, loaded_tokens=0, computed_tokens=0, mismatches=0, failed_loads=0,
                          failed_saves=0)

    def admit(self, req):
        blocks_needed = -(-len(req.tokens) // BLOCK_TOKENS)
        if len(self.free) < blocks_needed:
            return False
        req.blocks = [self.free.pop() for _ in range(blocks_needed)]
        req.lookup = self.conn.lookup(req.keys, self.group)
        self.by_lookup[req.lookup] = req
        self.active[req.id] = req
        return True

    def spec(self, req, tokens, lease=0, save=False):
        first, last = tokens.begin // CHUNK_TOKENS, -(-tokens.end // CHUNK_TOKENS)
        spec = kvstrand.TransferSpec(request=req.id, registration=self.group, tokens=tokens,
                                     keys=req.keys[first:last],
                                     blocks=req.blocks[tokens.begin // BLOCK_TOKENS:tokens.end // BLOCK_TOKENS],
                                     tier_lease=lease)
        if save and self.describe:
            spec.chunk_events = [describe(req, c) for c in range(first, last)]
        return spec

    def drain(self):
        f = self.conn.finished()
        for answer in f.lookups:
            req = self.by_lookup.pop(answer.id)
            req.lookup = None
            plan = kvstrand.plan_hit(self.layout, prompt_tokens=len(req.tokens), tier=answer.hit)
            req.saves.note_stored(answer.hit.tokens)
            if plan.load is None:
                if answer.lease:
                    self.conn.release_lookup(answer.lease)
                continue
            req.loading = plan.load
            req.saves.load_decided(plan.load)
            self.ops.append(kvstrand.Op(kvstrand.TransferKind.load, self.spec(req, plan.load, answer.lease)))
        for out in f.loads:
            req = self.active[out.request]
            req.live -= 1
            if out.ok:
                req.frontier = out.tokens.end
                self.stats["resumed"] += 1
                self.stats["loaded_tokens"] += len(out.tokens)
                self.verify(req, out.tokens)
            else:  # recompute instead: exactly what a full recompute would produce
                self.stats["failed_loads"] += 1
            req.saves.load_settled(kvstrand.LoadOutcome.landed if out.ok else kvstrand.LoadOutcome.failed)
            req.loading = None
        for out in f.saves:
            req = self.active[out.request]
            req.live -= 1
            req.saves.save_settled(out.ok)
            if not out.ok:
                # The tier refused or could not be reached (tier_unavailable:
                # no server answers; the library keeps trying to attach in
                # the background). A cache is best effort: this request goes
                # on without it, its blocks free once its transfers end, so
                # a server's restart never stalls admission.
                self.stats["failed_saves"] += 1
                req.saves.abandon(len(req.tokens))

    def verify(self, req, tokens):
        for end in range(tokens.begin + BLOCK_TOKENS, tokens.end + 1, BLOCK_TOKENS):
            block = req.blocks[end // BLOCK_TOKENS - 1]
            for plane in (0, 1):
                if self.dev.read(plane, block) != model_kv(req.tokens, end, plane).tobytes():
                    self.stats["mismatches"] += 1

    def compute(self, req, budget):
        """One prefill chunk of the toy model, written into the request's blocks."""
        end = min(len(req.tokens), req.frontier + budget)
        for block_end in range(req.frontier + BLOCK_TOKENS, end + 1, BLOCK_TOKENS):
            for plane in (0, 1):
                self.dev.write(plane, req.blocks[block_end // BLOCK_TOKENS - 1], model_kv(req.tokens, block_end, plane))
        self.stats["computed_tokens"] += end - req.frontier
        req.frontier = end
        req.done = req.frontier == len(req.tokens)

    def step(self, budget):
        self.ops = []
        self.drain()
        for req in list(self.active.values()):
            if req.lookup is None and req.loading is None and not req.done:
                self.compute(req, budget)
            if req.lookup is None and req.loading is None and req.saves.save_in_flight is None:
                save = req.saves.next_save(req.frontier)
                if save is not None:  # whole chunks, committed
                    self.ops.append(kvstrand.Op(kvstrand.TransferKind.save, self.spec(req, save, save=True)))
                elif req.done and req.live == 0:  # every transfer terminal: the blocks may be reused
                    self.free.extend(req.blocks)
                    del self.active[req.id]
        for op in self.ops:
            self.active[op.spec.request].live += 1
        if self.ops:
            self.conn.submit(self.ops)


def workload(n, seed):
    rng = np.random.default_rng(seed)
    prefixes = [rng.integers(0, 50_000, 512).tolist() for _ in range(4)]
    for i in range(n):
        shared = prefixes[i % len(prefixes)][: int(rng.integers(1, 9)) * CHUNK_TOKENS]
        yield f"req-{i}", shared + rng.integers(0, 50_000, int(rng.integers(1, 200))).tolist()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "),
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--server", help="kvstrand-server's socket (default: an embedded tier)")
    p.add_argument("--budget", type=int, default=128, help="prefill tokens per request per step")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--describe", action="store_true",
                   help="with --server: send each save's chunk descriptions, for the server's KV events")
    args = p.parse_args()

    e = Engine(args)
    pending = list(workload(args.requests, args.seed))
    t0, steps = time.monotonic(), 0
    while pending or e.active:
        while pending and len(e.active) < 8 and e.admit(Request(*pending[0], e.layout)):
            pending.pop(0)
            e.stats["requests"] += 1
        e.step(args.budget)
        steps += 1
        if steps % 200 == 0:
            print(f"  step {steps}: {e.stats['requests']} admitted, {len(e.active)} active", flush=True)
        time.sleep(0.0005)  # the rest of a real step: the forward pass
    e.conn.close()
    s = e.stats
    print(f"kvstrand {kvstrand.__version__} ({kvstrand.backend()}, {'node tier' if args.server else 'embedded tier'}): "
          f"{s['requests']} requests in {steps} steps, {time.monotonic() - t0:.2f} s; {s['resumed']} resumed "
          f"({s['loaded_tokens']} tokens loaded, {s['computed_tokens']} computed), {s['failed_loads']} failed loads, "
          f"{s['failed_saves']} failed saves, {s['mismatches']} mismatches")
    return 3 if s["mismatches"] else 0


if __name__ == "__main__":
    sys.exit(main())
