"""What test_vllm*.py share: the prompts and model shapes they run, the
markers for one picture of vLLM, and spoiling a worker's leases."""

import pytest

import kvstrand
from mini_vllm import BLOCK, HEAD, HEADS, NEWEST


PREFIX = list(range(1000, 1256))  # four 64-token chunks
needs_sim_hooks = pytest.mark.skipif(not kvstrand.sim.available(), reason="needs the sim backend's stream hooks")
HYBRID = [("full", 2, 0), ("sliding", 1, 32)]
# The seed's shape: attention plus single-layer Mamba groups as vLLM's
# --mamba-cache-mode align presents them.
MAMBA = [("full", 2, 0), ("mamba", 1, 0), ("mamba", 1, 0)]
# v0.18 cannot recover a failed load under several KV-cache groups, and
# asserts no external KV for Mamba: kvstrand.vllm refuses both there
# (test_v018_refuses_hybrid_models_at_start), so what serves them runs
# against the newest picture.
newest_only = pytest.mark.skipif(not NEWEST, reason="a hybrid model: refused under vLLM v0.18")
oldest_only = pytest.mark.skipif(NEWEST, reason="what vLLM v0.18 does")
BASE = "vllm.distributed.kv_transfer.kv_connector.v1.base"
BLOCK_ELEMS = BLOCK * HEADS * HEAD


def spoil_leases(rank, spoiled, groups=None):
    """A metadata hook truncating `rank`'s lease of every load (of `groups`
    only, if given), noting each request spoiled."""
    def spoil(meta):
        for job in meta.loads:
            for part in job.parts:
                if groups is None or part.group in groups:
                    part.handoff[rank] = part.handoff[rank][:-1]
            spoiled.append(job.req_id)
    return spoil
