#include "connector/packed_spec.hpp"

#include <cstring>
#include <type_traits>

namespace kvstrand::connector {

namespace {

static_assert(std::is_trivially_copyable_v<kv::ChunkKey> && sizeof(kv::ChunkKey) % 4 == 0);
static_assert(sizeof(kv::BlockId) == 4 && sizeof(std::int32_t) == 4);
constexpr std::size_t kKeyWords = sizeof(kv::ChunkKey) / 4;
#if defined(__GLIBCXX__) && defined(__x86_64__)
// Every field of TransferSpec is packed below: one added there must be
// packed here too (test_packed_spec round-trips each field).
static_assert(sizeof(kv::TransferSpec) == 168, "TransferSpec changed: pack() and unpack_into() must carry the new field");
#endif

// The header's words, then the keys, blocks, state slots and the request's
// bytes, each run as long as the header says; then, where the spec has
// chunk events, a word of each one's length and its bytes, one after another.
enum Word : std::size_t {
  registration,
  tokens_begin,
  tokens_end,
  keys,
  blocks,
  state_slots,
  request_bytes,
  with_state,
  lease_low,
  lease_high,
  tier_lease_low,
  tier_lease_high,
  chunk_events,
  header_words
};

constexpr std::size_t words_of(std::size_t bytes) { return (bytes + 3) / 4; }

}  // namespace

void pack(const kv::TransferSpec& s, PackedSpec& into) {
  std::size_t event_words = 0;
  for (const std::string& e : s.chunk_events) event_words += 1 + words_of(e.size());
  const std::size_t n = header_words + s.keys.size() * kKeyWords + s.blocks.size() + s.state_slots.size() +
                        words_of(s.request.size()) + event_words;
  std::uint32_t* w = into.resize(n);
  w[registration] = s.registration;
  w[tokens_begin] = s.tokens.begin;
  w[tokens_end] = s.tokens.end;
  w[keys] = static_cast<std::uint32_t>(s.keys.size());
  w[blocks] = static_cast<std::uint32_t>(s.blocks.size());
  w[state_slots] = static_cast<std::uint32_t>(s.state_slots.size());
  w[request_bytes] = static_cast<std::uint32_t>(s.request.size());
  w[with_state] = s.with_state ? 1 : 0;
  w[lease_low] = static_cast<std::uint32_t>(s.lease);
  w[lease_high] = static_cast<std::uint32_t>(s.lease >> 32);
  w[tier_lease_low] = static_cast<std::uint32_t>(s.tier_lease);
  w[tier_lease_high] = static_cast<std::uint32_t>(s.tier_lease >> 32);
  w[chunk_events] = static_cast<std::uint32_t>(s.chunk_events.size());
  w += header_words;
  if (!s.keys.empty()) std::memcpy(w, s.keys.data(), s.keys.size() * sizeof(kv::ChunkKey));
  w += s.keys.size() * kKeyWords;
  if (!s.blocks.empty()) std::memcpy(w, s.blocks.data(), s.blocks.size() * 4);
  w += s.blocks.size();
  if (!s.state_slots.empty()) std::memcpy(w, s.state_slots.data(), s.state_slots.size() * 4);
  w += s.state_slots.size();
  const auto put_bytes = [&](const std::string& b) {
    if (b.empty()) return;
    w[words_of(b.size()) - 1] = 0;  // the last word's padding, not left indeterminate
    std::memcpy(w, b.data(), b.size());
    w += words_of(b.size());
  };
  put_bytes(s.request);
  for (const std::string& e : s.chunk_events) {
    *w++ = static_cast<std::uint32_t>(e.size());
    put_bytes(e);
  }
}

void unpack_into(std::span<const std::uint32_t> packed, kv::TransferSpec& s) {
  const std::uint32_t* w = packed.data();
  s.registration = w[registration];
  s.tokens = {w[tokens_begin], w[tokens_end]};
  s.with_state = w[with_state] != 0;
  s.lease = std::uint64_t{w[lease_low]} | std::uint64_t{w[lease_high]} << 32;
  s.tier_lease = std::uint64_t{w[tier_lease_low]} | std::uint64_t{w[tier_lease_high]} << 32;
  const std::uint32_t* p = w + header_words;
  s.keys.resize(w[keys]);
  if (!s.keys.empty()) std::memcpy(static_cast<void*>(s.keys.data()), p, s.keys.size() * sizeof(kv::ChunkKey));
  p += s.keys.size() * kKeyWords;
  s.blocks.assign(p, p + w[blocks]);
  p += w[blocks];
  s.state_slots.resize(w[state_slots]);
  if (!s.state_slots.empty()) std::memcpy(s.state_slots.data(), p, s.state_slots.size() * 4);
  p += w[state_slots];
  s.request.assign(reinterpret_cast<const char*>(p), w[request_bytes]);
  p += words_of(w[request_bytes]);
  s.chunk_events.resize(w[chunk_events]);
  for (std::string& e : s.chunk_events) {
    const std::uint32_t bytes = *p++;
    e.assign(reinterpret_cast<const char*>(p), bytes);
    p += words_of(bytes);
  }
}

}  // namespace kvstrand::connector
