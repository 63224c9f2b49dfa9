"""The two places of vLLM v0.18's Scheduler that kvstrand.vllm reads at
start-up: the load-failure path reads exactly one KV-cache group's blocks
(it raises on more), and the Mamba split asserts that no external KV is
loaded for a Mamba model."""


class Scheduler:
    def _update_requests_with_invalid_blocks(self, requests, invalid_block_ids, evict_blocks=True):
        for request in requests:
            (req_block_ids,) = self.kv_cache_manager.get_block_ids(request.request_id)
            del req_block_ids

    def _mamba_block_aligned_split(self, request, num_new_tokens, num_new_local_computed_tokens=0,
                                   num_external_computed_tokens=0):
        assert num_external_computed_tokens == 0, "External KV connector is not verified yet"
        return num_new_tokens
