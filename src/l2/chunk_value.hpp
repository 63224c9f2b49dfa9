// How one chunk object is kept in L2: its Redis key, and a value that says
// what it is before anyone trusts it.
//
// Key:   "kvstrand:v1:{" HASH "}:" NS ":" RANK — the chunk hash as the hash
//        tag (objects spread over the cluster's slots by content), the
//        namespace (model, layout, tenant salt) and the rank, so two models
//        or tenants never share a key.
// Value: the stored-object header (tier/object_header: magic, version,
//        flags, length, the full chunk key, the object's checksum or the
//        MAC's nonce and tag, the header's checksum), then the object's bytes.
// A value whose header, length or checksum does not match what the reader
// expects is refused: a miss, never loaded.
//
// What each protects against: the XXH3 checksums catch accidents (a torn or
// truncated value, a value of another format or chunk), not a writer who
// recomputes them. With a node-shared secret (MacKey, --l2-mac-key-file)
// every value instead carries a MAC over the header's first 92 bytes and the
// object (GMAC under a key derived for that value from the secret and the
// value's random nonce, chunk_value.cpp): a Redis client that can write
// values but has not the secret can neither forge nor alter one that a node
// loads. Neither hides the values: whoever reads Redis reads the KV.
#pragma once

#include "common/expected.hpp"
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <kvstrand/chunk_keys.hpp>
#include "tier/object_header.hpp"

namespace kvstrand::l2 {

inline constexpr std::size_t kChunkHeaderBytes = tier::kObjectHeaderBytes;

inline constexpr std::size_t kMinMacKeyBytes = 32;

// The node-shared secret: at least kMinMacKeyBytes bytes (the first line of
// --l2-mac-key-file). Every node that shares the L2 needs the same one.
struct MacKey {
  std::string secret;
};

std::string redis_key_of(const kv::ChunkKey& key);
// Where a value's KV-event description is kept (the server's --events): its
// key with ":events" after it, in the same hash slot. Apart from the value,
// so that a node of an earlier version reads the value as it always did.
std::string redis_description_key_of(const kv::ChunkKey& key);

// The header and the object's bytes, in one string (the SET's value); with a
// MAC under `mac` when given.
std::string encode_chunk_value(const kv::ChunkKey& key, bool has_image, std::span<const std::byte> object,
                               const MacKey* mac = nullptr);

struct ChunkValue {
  bool has_image = false;
  std::span<const std::byte> object;  // into the value given to decode
};

enum class Refusal {
  corrupt,          // torn, truncated, of another format or chunk: worth deleting
  unauthenticated,  // its MAC fails, or it has none where one is required (or one where this node has no key):
                    // another deployment's, or forged; left in Redis
};

// The object in `value` if it is the chunk `key` of `object_bytes` bytes,
// whole and unaltered, and (with `mac`) written under that key; else none,
// with the reason, and its kind in `refusal` (when given). Without a
// key a value carrying a MAC is refused too: nodes sharing an L2 must share
// the key, and a node without it cannot tell a forged value from a real one.
common::Expected<ChunkValue> decode_chunk_value(std::string_view value, const kv::ChunkKey& key,
                                                std::uint64_t object_bytes, const MacKey* mac = nullptr,
                                                Refusal* refusal = nullptr);

}  // namespace kvstrand::l2
