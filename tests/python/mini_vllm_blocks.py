"""vLLM's block bookkeeping in mini_vllm.py's miniature (written for kvstrand
from reading vLLM's source, not copied from it): the block pool and the KV
cache manager.

- One block pool with the null block (id 0) for every KV-cache group, blocks
  allocated per step (allocate_slots), a local prefix cache of full blocks
  hashed with those extra keys, freed blocks kept cached until reused, and
  sliding-window groups whose passed blocks become the null block.

Mamba groups as --mamba-cache-mode align runs them (MambaManager and
Scheduler._mamba_block_aligned_split): a prefill step's token count is cut
to whole blocks (the prompt's last whole block forced to be a step end);
each step allocates at most one block, at the index of the block its end
falls in, with the null block before it; the block at index i holds the
state at the end of the last step that ended in it, and is cached once full
(the state at (i + 1) * block_size); every block before the current state's
is freed at the request's next allocation (remove_skipped_blocks and the
"last state block", two steps after the step that wrote it). The
forward pass reads the state it resumes from out of the block of its first
token and writes the new state into the block of its end, and checks the
state it read: a wrong restored state is a mismatch."""

from collections import deque

from mini_vllm_model import BLOCK, NULL, KVCacheBlocks, block_hashes


class BlockPool:
    """vLLM's block pool, small: reference counts, a free queue whose head is
    reused first (freed blocks keep their hash until then), the null block."""

    def __init__(self, num_blocks):
        self.ref = [0] * num_blocks
        self.free_queue = deque(range(1, num_blocks))  # block 0 is the null block
        self.cached = {}     # (group, block hash) -> block
        self.hash_of = {}    # block -> (group, block hash)

    def num_free(self):
        return len(self.free_queue)

    def take(self):
        b = self.free_queue.popleft()
        if b in self.hash_of:  # evicted from the prefix cache on reuse
            del self.cached[self.hash_of.pop(b)]
        self.ref[b] = 1
        return b

    def touch(self, b):
        if b == NULL:
            return
        if self.ref[b] == 0:
            self.free_queue.remove(b)
        self.ref[b] += 1

    def release(self, b):
        if b == NULL:
            return
        assert self.ref[b] > 0, f"block {b} freed twice"
        self.ref[b] -= 1
        if self.ref[b] == 0:
            self.free_queue.append(b)


class KVCacheManager:
    def __init__(self, num_blocks, windows, caching=True, mamba=()):
        self.pool = BlockPool(num_blocks)
        self.windows = windows      # per group: 0 for full attention, else the sliding window
        self.mamba = set(mamba)     # Mamba groups (align mode)
        self.caching = caching
        self.blocks = {}            # request id -> per group list of block ids
        self.cached_upto = {}       # request id -> per group blocks already in the prefix cache

    def block_hashes(self, req, n):
        return block_hashes(req, n)

    def skipped_blocks(self, g, computed):
        if g in self.mamba:  # only the state of the last computed token is needed
            return max(0, computed - 1) // BLOCK
        window = self.windows[g]
        return max(0, computed - window + 1) // BLOCK if window else 0

    def get_computed_blocks(self, req):
        """The longest prefix of full blocks every group holds (a sliding
        window only its last window), at most num_tokens - 1 tokens."""
        if not self.caching:
            return [[] for _ in self.windows], 0
        hashes = self.block_hashes(req, (req.num_tokens - 1) // BLOCK)
        for n in range(len(hashes), 0, -1):
            hit = []
            for g in range(len(self.windows)):
                first = self.skipped_blocks(g, n * BLOCK)
                ids = [self.pool.cached.get((g, h)) for h in hashes[first:n]]
                if None in ids:
                    break
                hit.append([NULL] * first + ids)
            else:
                return hit, n * BLOCK
        return [[] for _ in self.windows], 0

    def remove_skipped_blocks(self, req_id, computed):
        for g, ids in enumerate(self.blocks.get(req_id, [])):
            for i in range(min(self.skipped_blocks(g, computed), len(ids))):
                if ids[i] != NULL:
                    self.pool.release(ids[i])
                    ids[i] = NULL

    def allocate_slots(self, req, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None,
                       num_lookahead_tokens=0, num_external_computed_tokens=0, delay_cache_blocks=False):
        computed = req.num_computed_tokens + num_new_computed_tokens + num_external_computed_tokens
        self.remove_skipped_blocks(req.request_id, computed)
        have = self.blocks.get(req.request_id) or [[] for _ in self.windows]
        hit = [list(ids) for ids in (new_computed_blocks or [[] for _ in self.windows])]
        need = -(-(computed + num_new_tokens + num_lookahead_tokens) // BLOCK)
        plan = []
        for g in range(len(self.windows)):
            skipped = self.skipped_blocks(g, computed)
            # Hit blocks the computed tokens (external ones too) have passed
            # are not taken (allocate_new_computed_blocks).
            hit[g] = [NULL if len(have[g]) + i < skipped else b for i, b in enumerate(hit[g])]
            start = len(have[g]) + len(hit[g])
            if g in self.mamba:
                # Align mode: lookahead tokens get no block; one block, where
                # the end of what is computed (or loaded) falls.
                last = -(-(computed + num_new_tokens) // BLOCK) - 1
                plan.append([None if i == last else NULL for i in range(start, last + 1)])
                continue
            plan.append([NULL if i < skipped else None for i in range(start, need)])
        touched_free = sum(1 for ids in hit for b in ids if b != NULL and self.pool.ref[b] == 0)
        if sum(p.count(None) for p in plan) > self.pool.num_free() - touched_free:
            return None
        blocks = self.blocks.setdefault(req.request_id, have)
        self.cached_upto.setdefault(req.request_id, [0] * len(self.windows))
        new = []
        for g in range(len(self.windows)):
            for b in hit[g]:
                self.pool.touch(b)
            blocks[g].extend(hit[g])
            self.cached_upto[req.request_id][g] = max(self.cached_upto[req.request_id][g], len(hit[g]))
            fresh = [NULL if b == NULL else self.pool.take() for b in plan[g]]
            blocks[g].extend(fresh)
            # A Mamba group's new entries come back whole, null blocks
            # included (MambaManager.allocate_new_blocks returns them).
            new.append(fresh if g in self.mamba else [b for b in fresh if b != NULL])
        if not delay_cache_blocks:
            self.cache_blocks(req, min(computed + num_new_tokens, req.num_tokens))
        return KVCacheBlocks(new)

    def cache_blocks(self, req, num_tokens):
        if not self.caching or req.request_id not in self.blocks:
            return
        n = num_tokens // BLOCK
        hashes = self.block_hashes(req, n)
        upto = self.cached_upto[req.request_id]
        for g, ids in enumerate(self.blocks[req.request_id]):
            for i in range(upto[g], min(n, len(ids))):
                key = (g, hashes[i])
                if ids[i] != NULL and key not in self.pool.cached and ids[i] not in self.pool.hash_of:
                    self.pool.cached[key] = ids[i]
                    self.pool.hash_of[ids[i]] = key
            upto[g] = max(upto[g], min(n, len(ids)))

    def get_blocks(self, req_id):
        return KVCacheBlocks(self.blocks.get(req_id) or [[] for _ in self.windows])

    def get_block_ids(self, req_id):
        return tuple(list(ids) for ids in (self.blocks.get(req_id) or [[] for _ in self.windows]))

    def free(self, req):
        for ids in self.blocks.pop(req.request_id, []):
            for b in reversed(ids):  # the tail first: evicted before the prefix others may share
                self.pool.release(b)
        self.cached_upto.pop(req.request_id, None)
