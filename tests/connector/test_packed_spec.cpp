// A TransferSpec packed for the strand and unpacked there: every field
// comes back as it was, whatever was packed into the buffer before.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "connector/packed_spec.hpp"

using namespace kvstrand;

namespace {

kv::ChunkKey key(int i) {
  kv::ChunkKey k;
  for (std::size_t b = 0; b < k.hash.size(); ++b) k.hash[b] = static_cast<std::byte>(i * 31 + b);
  for (std::size_t b = 0; b < k.ns.size(); ++b) k.ns[b] = static_cast<std::byte>(i * 7 + b * 3);
  k.kv_rank = static_cast<std::uint32_t>(i + 3);
  return k;
}

// Every field set, none to its default.
kv::TransferSpec full(std::string request, std::size_t chunks) {
  kv::TransferSpec s;
  s.request = std::move(request);
  s.registration = 7;
  s.tokens = {256, static_cast<std::uint32_t>(256 + 256 * chunks)};
  for (std::size_t c = 0; c < chunks; ++c) s.keys.push_back(key(static_cast<int>(c)));
  for (std::uint32_t b = 0; b < 16 * chunks; ++b) s.blocks.push_back(1000 + b * 3);
  s.with_state = true;
  for (std::size_t c = 0; c < chunks; ++c) s.state_slots.push_back(c % 2 ? -1 : static_cast<std::int32_t>(c));
  s.lease = (std::uint64_t{0xabcd} << 32) | 0x1234;       // both halves of each 64-bit field
  s.tier_lease = (std::uint64_t{0x5eed} << 32) | 0xbeef;
  // Of every length modulo 4, binary (a NUL inside), one empty.
  for (std::size_t c = 0; c < chunks; ++c)
    s.chunk_events.push_back(c == 1 ? std::string() : std::string("\x81\xac" "block_hashes" "\x00" "abc", 15 + c % 4) + request);
  return s;
}

void require_same(const kv::TransferSpec& a, const kv::TransferSpec& b) {
  REQUIRE(a.request == b.request);
  REQUIRE(a.registration == b.registration);
  REQUIRE(a.tokens.begin == b.tokens.begin);
  REQUIRE(a.tokens.end == b.tokens.end);
  REQUIRE(a.keys == b.keys);
  REQUIRE(a.blocks == b.blocks);
  REQUIRE(a.with_state == b.with_state);
  REQUIRE(a.state_slots == b.state_slots);
  REQUIRE(a.lease == b.lease);
  REQUIRE(a.tier_lease == b.tier_lease);
  REQUIRE(a.chunk_events == b.chunk_events);
}

kv::TransferSpec unpacked(std::span<const std::uint32_t> words) {
  kv::TransferSpec s;
  connector::unpack_into(words, s);
  return s;
}

}  // namespace

TEST_CASE("packed spec: every field comes back, for requests of every length modulo 4", "[reactor]") {
  connector::PackedSpec buf;
  for (const std::string& request : {std::string("r"), std::string("ab"), std::string("abc"), std::string("abcd"),
                                     std::string("cmpl-5f0e9c1a-2b7d-4e8a-9c3f-0d1e2f3a4b5c-0")}) {
    INFO(request);
    const kv::TransferSpec s = full(request, 3);
    connector::pack(s, buf);
    require_same(unpacked(buf.words()), s);
  }
}

TEST_CASE("packed spec: an empty spec, and a small one packed over a larger one, come back exactly",
          "[reactor]") {
  connector::PackedSpec buf;
  connector::pack(kv::TransferSpec{}, buf);
  require_same(unpacked(buf.words()), kv::TransferSpec{});

  connector::pack(full("a-long-request-name-that-is-not-short-string-optimised", 8), buf);
  kv::TransferSpec small = full("x", 1);
  small.with_state = false;
  small.state_slots.clear();
  small.lease = 0;
  small.chunk_events.clear();
  connector::pack(small, buf);
  require_same(unpacked(buf.words()), small);
}

TEST_CASE("packed spec: unpacked over a larger spec, a small one comes back exactly", "[reactor]") {
  connector::PackedSpec buf;
  kv::TransferSpec into = full("a-long-request-name-that-is-not-short-string-optimised", 8);
  kv::TransferSpec small = full("x", 1);
  small.with_state = false;
  small.state_slots.clear();
  small.lease = 0;
  small.tier_lease = 0;
  small.chunk_events.clear();
  connector::pack(small, buf);
  connector::unpack_into(buf.words(), into);
  require_same(into, small);
  // And back: every field of the larger one, over the small one.
  const kv::TransferSpec large = full("another-long-request-name-not-short-string-optimised", 5);
  connector::pack(large, buf);
  connector::unpack_into(buf.words(), into);
  require_same(into, large);
}
