// The example engine's device memory: writes through the step's staging
// area, images, and the verification of a resumed request against a full
// recompute.
#include "engine_impl.hpp"

namespace kvstrand::engine {

std::byte* Engine::Impl::stage(std::size_t n) {
  if (staged + n > half_bytes) {  // full: let every queued copy drain, start over
    stream.synchronize();
    staged = 0;
  }
  std::byte* p = staging->data() + side * half_bytes + staged;
  staged += n;
  return p;
}

void Engine::Impl::end_step() {
  if (!half_done[side]) half_done[side].emplace(DeviceEvent::create());
  half_done[side]->record(stream);
  side ^= 1;
  staged = 0;
  if (half_done[side]) half_done[side]->synchronize();  // two steps old
}

void Engine::Impl::write_image(std::int32_t slot, const ToyState& s) {
  const auto img = model.image(s);
  std::byte* p = stage(img.size());
  std::memcpy(p, img.data(), img.size());
  pool.state().write_async(pool.slot_offset(slot), {p, img.size()}, stream);
}

ToyState Engine::Impl::read_image(std::int32_t slot) {
  const std::uint64_t n = cfg.layout.checkpoint.image_bytes;
  auto& buf = readback_buffer(n);
  pool.state().read_async(pool.slot_offset(slot), {buf.data(), n}, stream);
  stream.synchronize();
  ToyState s;
  if (!ToyModel::from_image({buf.data(), n}, &s)) s.cursor = ~0ull;  // garbage: the verify step says so
  return s;
}

HostMemory& Engine::Impl::readback_buffer(std::uint64_t n) {
  if (!readback || readback->size() < n) readback.emplace(HostMemory::allocate(n));
  return *readback;
}

void Engine::Impl::compute(Request& r, std::uint32_t a, std::uint32_t b, const std::uint32_t* seq) {
  const auto& l = cfg.layout;
  std::uint32_t t = a;
  while (t < b) {
    const std::uint32_t block = t / l.block_tokens;
    const std::uint32_t end = std::min(b, (block + 1) * l.block_tokens);
    const std::uint32_t off = t % l.block_tokens;
    std::vector<std::byte*> dst(l.planes.size());
    for (std::size_t p = 0; p < l.planes.size(); ++p) dst[p] = stage((end - t) * model.bytes_per_token(p));
    const std::uint64_t dbpt = draft_model ? draft_model->bytes_per_token(0) : 0;
    std::byte* draft_dst = draft_model ? stage((end - t) * dbpt) : nullptr;
    for (std::uint32_t u = t; u < end; ++u) {
      const std::uint64_t h = ToyModel::advance(r.state, seq[u - a]);
      for (std::size_t p = 0; p < l.planes.size(); ++p)
        model.token_kv(h, p, dst[p] + (u - t) * model.bytes_per_token(p));
      if (draft_model) draft_model->token_kv(h ^ kDraftSalt, 0, draft_dst + (u - t) * dbpt);
      // A checkpoint at every chunk end of the prompt, taken now: after
      // exactly the committed tokens, before the state moves on (F6, F7).
      if ((u + 1) % l.chunk_tokens == 0 && u + 1 <= r.prompt()) {
        const kv::Digest& hash = r.block_hashes[(u + 1) / l.block_tokens - 1];
        if (!pool.checkpoint(hash))
          if (auto s = pool.checkpoint_slot_for(hash)) write_image(*s, r.state);
      }
    }
    const kv::BlockId dev = r.table[block];
    for (std::size_t p = 0; p < l.planes.size(); ++p)
      pool.plane(p).write_async(dev * l.planes[p].bytes_per_block + off * model.bytes_per_token(p),
                                {dst[p], (end - t) * model.bytes_per_token(p)}, stream);
    if (draft_model)
      draft_plane->write_async(dev * draft_layout->planes[0].bytes_per_block + off * dbpt, {draft_dst, (end - t) * dbpt},
                               stream);
    if (end % l.block_tokens == 0 && end <= r.prompt()) pool.commit(dev, r.block_hashes[block]);
    t = end;
  }
}

const ToyModel::Reference& Engine::Impl::reference(std::uint32_t prompt) {
  auto it = references.find(prompt);
  if (it == references.end())
    it = references.emplace(prompt, ToyModel::reference(prompts.at(prompt), work.output_tokens)).first;
  return it->second;
}

void Engine::Impl::verify_prefill(Request& r) {
  const auto& ref = reference(r.prompt_index);
  const auto& l = cfg.layout;
  std::uint64_t per_block = 0;
  for (const auto& p : l.planes) per_block += p.bytes_per_block;
  const std::uint32_t blocks = (r.prompt() + l.block_tokens - 1) / l.block_tokens;
  auto& buf = readback_buffer(std::max<std::uint64_t>(blocks * per_block, l.checkpoint.image_bytes));
  stream.synchronize();
  std::uint64_t off = 0;
  for (std::size_t p = 0; p < l.planes.size(); ++p)
    for (std::uint32_t b = 0; b < blocks; ++b, off += l.planes[p].bytes_per_block)
      pool.plane(p).read_async(r.table[b] * l.planes[p].bytes_per_block, {buf.data() + off, l.planes[p].bytes_per_block},
                               stream);
  stream.synchronize();
  std::string bad;
  std::vector<std::byte> expect;
  off = 0;
  for (std::size_t p = 0; p < l.planes.size() && bad.empty(); ++p) {
    const std::uint64_t bpt = model.bytes_per_token(p);
    expect.resize(bpt);
    for (std::uint32_t b = 0; b < blocks && bad.empty(); ++b, off += l.planes[p].bytes_per_block)
      for (std::uint32_t u = 0; u < l.block_tokens && b * l.block_tokens + u < r.prompt(); ++u) {
        model.token_kv(ref.hashes[b * l.block_tokens + u], p, expect.data());
        if (std::memcmp(buf.data() + off + u * bpt, expect.data(), bpt) != 0) {
          bad = "KV of token " + std::to_string(b * l.block_tokens + u) + ", plane " + l.planes[p].name;
          break;
        }
      }
  }
  if (bad.empty()) {
    const auto img = model.image(ref.prompt_state);
    pool.state().read_async(pool.slot_offset(r.slot), {buf.data(), img.size()}, stream);
    stream.synchronize();
    if (std::memcmp(buf.data(), img.data(), img.size()) != 0) bad = "state image at the prompt's end";
  }
  if (bad.empty() && draft_model) {  // the draft group's KV, in the same blocks of its own pool
    const std::uint64_t dbpb = draft_layout->planes[0].bytes_per_block, dbpt = draft_model->bytes_per_token(0);
    auto& dbuf = readback_buffer(std::max<std::uint64_t>(blocks * dbpb, blocks * per_block));
    for (std::uint32_t b = 0; b < blocks; ++b)
      draft_plane->read_async(r.table[b] * dbpb, {dbuf.data() + b * dbpb, dbpb}, stream);
    stream.synchronize();
    expect.resize(dbpt);
    for (std::uint32_t t = 0; t < r.prompt() && bad.empty(); ++t) {
      draft_model->token_kv(ref.hashes[t] ^ kDraftSalt, 0, expect.data());
      if (std::memcmp(dbuf.data() + t / l.block_tokens * dbpb + t % l.block_tokens * dbpt, expect.data(), dbpt) != 0)
        bad = "draft KV of token " + std::to_string(t);
    }
  }
  ++stats.verified;
  if (!bad.empty()) mismatch(r, bad);
}

void Engine::Impl::mismatch(const Request& r, const std::string& what) {
  ++stats.mismatches;
  const std::string d = r.id + " (prompt " + std::to_string(r.prompt_index) + "): " + what;
  spdlog::error("engine: resumed request differs from a full recompute: {}", d);
  if (stats.mismatch_details.size() < 20) stats.mismatch_details.push_back(d);
}

}  // namespace kvstrand::engine
