"""The places of vLLM's Scheduler (00f4240) that kvstrand.vllm reads at
start-up. The block-level failure path still reads one KV-cache group (and
_handle_invalid_blocks raises under several); failures under several groups
are reported per request (KVConnectorTransferResults.failed_recving). The
Mamba split no longer asserts that no external KV is loaded."""


class Scheduler:
    def _update_requests_with_invalid_blocks(self, requests, invalid_block_ids, num_scheduled_tokens,
                                             evict_blocks=True):
        for request in requests:
            (req_block_ids,) = self.kv_cache_manager.get_block_ids(request.request_id)
            del req_block_ids

    def _mamba_block_aligned_split(self, request, num_new_tokens, num_new_local_computed_tokens=0,
                                   num_external_computed_tokens=0):
        return num_new_tokens
