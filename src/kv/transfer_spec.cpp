#include <kvstrand/transfer_spec.hpp>

namespace kvstrand::kv {

std::optional<TransferSpec> build_save(const std::string& request, TokenRange tokens, std::vector<ChunkKey> keys,
                                       std::span<const Digest> block_hashes, bool with_state,
                                       const CommittedBlocks& committed, BlockLeases& leases) {
  auto sources = committed.save_sources(block_hashes);
  if (!sources) return std::nullopt;
  TransferSpec spec;
  spec.request = request;
  spec.tokens = tokens;
  spec.keys = std::move(keys);
  spec.blocks = std::move(*sources);
  spec.with_state = with_state;
  spec.lease = leases.lease(spec.blocks);  // pinned until source-safe
  return spec;
}

}  // namespace kvstrand::kv
