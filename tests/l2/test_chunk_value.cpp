// The L2 value format (src/l2/chunk_value): a value is loaded only when it
// is exactly the chunk asked for, whole and unaltered.
#include <catch2/catch.hpp>

#include <cstring>

#include "l2/chunk_value.hpp"
#include "tier/object_header.hpp"

#include "object_fixtures.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

using namespace kvstrand;
using test::key;
using test::object;

namespace {

// Why `value` is refused as chunk `k` of `bytes` bytes (the REQUIRE fails
// when it is not).
std::string refused(std::string_view value, const kv::ChunkKey& k, std::uint64_t bytes,
                    const l2::MacKey* mac = nullptr, l2::Refusal* refusal = nullptr) {
  const auto d = l2::decode_chunk_value(value, k, bytes, mac, refusal);
  REQUIRE_FALSE(d.has_value());
  return d.why();
}

// Both XXH3 checksums recomputed, as anyone who knows the format can: the
// object's (at 92) and the header's (at 120).
void reseal(std::string& v) {
  auto put = [&](std::size_t at, std::uint64_t x) {
    for (int i = 0; i < 8; ++i) v[at + i] = static_cast<char>((x >> (8 * i)) & 0xff);
  };
  put(92, XXH3_64bits(v.data() + l2::kChunkHeaderBytes, v.size() - l2::kChunkHeaderBytes));
  put(120, XXH3_64bits(v.data(), 120));
}

}  // namespace

TEST_CASE("chunk value: a round trip gives the object's bytes and its image flag", "[l2]") {
  const auto o = object(16896, 7);
  for (bool image : {false, true}) {
    const std::string v = l2::encode_chunk_value(key(1), image, o);
    REQUIRE(v.size() == l2::kChunkHeaderBytes + o.size());
    auto d = l2::decode_chunk_value(v, key(1), o.size());
    INFO(d.why());
    REQUIRE(d.has_value());
    REQUIRE(d->has_image == image);
    REQUIRE(std::equal(d->object.begin(), d->object.end(), o.begin(), o.end()));
  }
}

TEST_CASE("chunk value: any changed byte, another chunk, size or truncation is refused with a reason", "[l2]") {
  const auto o = object(4096, 3);
  const std::string v = l2::encode_chunk_value(key(1), true, o);
  // Every byte of the header and a spread of the payload, flipped one at a time.
  for (std::size_t at = 0; at < v.size(); at += at < l2::kChunkHeaderBytes ? 1 : 97) {
    std::string bad = v;
    bad[at] = static_cast<char>(bad[at] ^ 0x20);
    INFO("byte " << at);
    REQUIRE_FALSE(l2::decode_chunk_value(bad, key(1), o.size()).has_value());
  }
  REQUIRE(refused(v, key(2), o.size()) == "another chunk's value");  // another hash
  REQUIRE_FALSE(l2::decode_chunk_value(v, key(1, 1), o.size()).has_value());  // another rank
  kv::ChunkKey other_ns = key(1);
  other_ns.ns[31] = std::byte{0};
  REQUIRE_FALSE(l2::decode_chunk_value(v, other_ns, o.size()).has_value());  // another model or tenant
  REQUIRE(refused(v, key(1), o.size() + 1).find("expected 4097 B") != std::string::npos);  // another object size
  REQUIRE_FALSE(l2::decode_chunk_value(v.substr(0, v.size() - 1), key(1), o.size()).has_value());
  REQUIRE(refused(v.substr(0, 100), key(1), o.size()).find("shorter than a header") != std::string::npos);
  REQUIRE_FALSE(l2::decode_chunk_value("garbage", key(1), o.size()).has_value());
  std::string payload_changed = v;
  payload_changed.back() = static_cast<char>(payload_changed.back() ^ 1);
  REQUIRE(refused(payload_changed, key(1), o.size()) == "payload checksum mismatch");
}

TEST_CASE("chunk value: keys carry namespace, rank and hash, the hash is the cluster hash tag", "[l2]") {
  const std::string a = l2::redis_key_of(key(1));
  REQUIRE(a.starts_with("kvstrand:v1:{"));
  REQUIRE(a != l2::redis_key_of(key(1, 1)));
  REQUIRE(a != l2::redis_key_of(key(2)));
  kv::ChunkKey other_ns = key(1);
  other_ns.ns[0] = std::byte{0};
  REQUIRE(a != l2::redis_key_of(other_ns));
  // Same content, other namespace: one slot (the tag is the hash), other keys.
  REQUIRE(a.substr(0, a.find('}')) == l2::redis_key_of(other_ns).substr(0, a.find('}')));
}

TEST_CASE("chunk value: a value of another format version is refused, even with a valid header checksum", "[l2]") {
  const auto o = object(1024, 5);
  std::string v = l2::encode_chunk_value(key(1), false, o);
  v[8] = 2;  // version 2 (a later kvstrand's layout), little-endian
  reseal(v);  // its header checksum made valid again, as a later writer's would be
  REQUIRE(refused(v, key(1), o.size()) == "format version 2");
}

TEST_CASE("chunk value: with a MAC key a value loads only if written under that key, whatever its checksums say",
          "[l2]") {
  const l2::MacKey mine{std::string(32, 'k')}, theirs{std::string(32, 'o')};
  const auto o = object(8192, 11);
  const std::string v = l2::encode_chunk_value(key(1), true, o, &mine);
  REQUIRE(v.size() == l2::kChunkHeaderBytes + o.size());
  l2::Refusal refusal = l2::Refusal::corrupt;
  auto d = l2::decode_chunk_value(v, key(1), o.size(), &mine, &refusal);
  INFO(d.why());
  REQUIRE(d.has_value());
  REQUIRE(d->has_image);
  REQUIRE(std::equal(d->object.begin(), d->object.end(), o.begin(), o.end()));
  SECTION("another key's value, and a node without a key, refuse it; it is not called corrupt") {
    REQUIRE(refused(v, key(1), o.size(), &theirs, &refusal).find("MAC does not match") != std::string::npos);
    REQUIRE(refusal == l2::Refusal::unauthenticated);
    REQUIRE(refused(v, key(1), o.size(), nullptr, &refusal).find("no key to check it") != std::string::npos);
    REQUIRE(refusal == l2::Refusal::unauthenticated);
  }
  SECTION("a value without a MAC is refused where one is required") {
    const std::string plain = l2::encode_chunk_value(key(1), true, o);
    REQUIRE(refused(plain, key(1), o.size(), &mine, &refusal).find("carries no MAC") != std::string::npos);
    REQUIRE(refusal == l2::Refusal::unauthenticated);
  }
  SECTION("a writer who knows the format but not the key: its altered object fails the MAC") {
    std::string forged = v;
    forged[l2::kChunkHeaderBytes + 100] = static_cast<char>(forged[l2::kChunkHeaderBytes + 100] ^ 1);
    reseal(forged);
    REQUIRE(refused(forged, key(1), o.size(), &mine, &refusal).find("MAC does not match") != std::string::npos);
    // Its MAC flag cleared and resealed: a node without a key (XXH3 only)
    // takes it, which is what the MAC is for; a node with one does not.
    forged[12] = static_cast<char>(forged[12] & ~2);
    reseal(forged);
    REQUIRE(l2::decode_chunk_value(forged, key(1), o.size()).has_value());
    REQUIRE_FALSE(l2::decode_chunk_value(forged, key(1), o.size(), &mine, &refusal).has_value());
  }
  SECTION("a writer who knows the format but not the key cannot relabel one chunk's value as another's") {
    // Chunk 1's value, its header's chunk key (namespace, rank, hash: bytes
    // 24 to 92) rewritten as another chunk's, its header checksum made good,
    // stored where that chunk is looked for. Each target differs from chunk
    // 1 in one part of the key only, so each part must be under the MAC.
    kv::ChunkKey other_ns = key(1);
    other_ns.ns[0] = std::byte{0x01};
    for (const kv::ChunkKey& target : {other_ns, key(1, 3), key(2)}) {
      const std::string target_v = l2::encode_chunk_value(target, true, o, &mine);
      std::string relabelled = v;
      relabelled.replace(24, 68, target_v, 24, 68);
      const std::uint64_t sum = XXH3_64bits(relabelled.data(), 120);
      for (int i = 0; i < 8; ++i) relabelled[120 + i] = static_cast<char>((sum >> (8 * i)) & 0xff);
      INFO("relabelled as " << l2::redis_key_of(target));
      REQUIRE(refused(relabelled, target, o.size(), &mine, &refusal).find("MAC does not match") != std::string::npos);
      REQUIRE(refusal == l2::Refusal::unauthenticated);
    }
  }
  SECTION("every byte of the header and a spread of the object, flipped, is refused") {
    for (std::size_t at = 0; at < v.size(); at += at < l2::kChunkHeaderBytes ? 1 : 331) {
      std::string bad = v;
      bad[at] = static_cast<char>(bad[at] ^ 0x04);
      INFO("byte " << at);
      REQUIRE_FALSE(l2::decode_chunk_value(bad, key(1), o.size(), &mine).has_value());
    }
  }
}

TEST_CASE("chunk value: a value begins with the stored-object header a disk object has, which says when it carries a MAC",
          "[l2][disk]") {
  const auto o = object(16896, 3);
  std::vector<std::byte> h(tier::kObjectHeaderBytes);
  tier::write_object_header(key(5), true, o, h.data());
  const std::string v = l2::encode_chunk_value(key(5), true, o);
  REQUIRE(std::memcmp(v.data(), h.data(), h.size()) == 0);
  // A value with a MAC is not a disk object: its header says it carries one,
  // and no object matches it by checksum.
  const l2::MacKey mac{std::string(32, 'k')};
  const std::string macd = l2::encode_chunk_value(key(5), true, o, &mac);
  auto got = tier::read_object_header(std::as_bytes(std::span(macd.data(), l2::kChunkHeaderBytes)));
  REQUIRE(got.has_value());
  REQUIRE(got->has_mac);
  REQUIRE_FALSE(tier::object_matches(*got, o));
}
