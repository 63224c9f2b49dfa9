// The example engine's saves: each chunk a request commits, its sources
// leased until every group's copy out of them ended.
#include "engine_impl.hpp"

namespace kvstrand::engine {

void Engine::Impl::post_saves(Request& r) {
  if (!conn || r.phase != Request::Phase::running || !kv::writes_to_tier(cfg.layout)) return;
  const auto range = r.tracker.next_save(std::min(r.computed, r.prompt()));
  if (!range) return;
  std::vector<std::int32_t> pinned;
  auto specs = build(r, *range, &pinned);
  if (specs.empty()) {
    r.tracker.save_settled(false);
    return;
  }
  post(r.n, std::move(specs), std::move(pinned));
}

std::vector<kv::TransferSpec> Engine::Impl::build(Request& r, kv::TokenRange range, std::vector<std::int32_t>* pinned) {
  auto spec = build_target(r, range, pinned);
  if (!spec) return {};
  std::vector<kv::TransferSpec> specs;
  if (draft_layout) specs.push_back(draft_spec(r, *spec));
  specs.insert(specs.begin(), std::move(*spec));
  return specs;
}

std::optional<kv::TransferSpec> Engine::Impl::build_target(Request& r, kv::TokenRange range, std::vector<std::int32_t>* pinned) {
  const auto& l = cfg.layout;
  const std::uint32_t c0 = range.begin / l.chunk_tokens, c1 = range.end / l.chunk_tokens;
  std::vector<kv::ChunkKey> keys(r.keys.begin() + c0, r.keys.begin() + c1);
  std::span<const kv::Digest> hashes(r.block_hashes.data() + range.begin / l.block_tokens,
                                     (range.end - range.begin) / l.block_tokens);
  const std::string name = r.id + ".s" + std::to_string(r.save_seq++);
  auto spec = kv::build_save(name, range, std::move(keys), hashes, true, pool.committed(), pool.leases());
  if (!spec) return std::nullopt;
  for (std::uint32_t c = c0; c < c1; ++c) {
    const auto slot = pool.checkpoint(r.block_hashes[(c + 1) * l.blocks_per_chunk() - 1]);
    spec->state_slots.push_back(slot.value_or(-1));
    if (slot) {
      pool.pin_slot(*slot);
      pinned->push_back(*slot);
    }
  }
  return spec;
}

void Engine::Impl::post(std::uint64_t n, std::vector<kv::TransferSpec> specs, std::vector<std::int32_t> pinned) {
  SaveInFlight in_flight{n, specs.front().lease, std::move(pinned)};
  in_flight.outcomes_left = in_flight.unsafe_left = static_cast<int>(specs.size());
  saves[specs.front().request] = std::move(in_flight);
  std::vector<Op> ops;
  for (auto& s : specs) ops.push_back({TransferKind::save, std::move(s), engine_point()});
  timed([&] { conn->submit(std::move(ops)); });
}

}  // namespace kvstrand::engine
