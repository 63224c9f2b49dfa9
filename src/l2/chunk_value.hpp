// How one chunk object is kept in L2: its Redis key, and a value that says
// what it is before anyone trusts it.
//
// Key:   "kvstrand:v1:{" HASH "}:" NS ":" RANK — the chunk hash as the hash
//        tag (objects spread over the cluster's slots by content), the
//        namespace (model, layout, tenant salt) and the rank, so two models
//        or tenants never share a key.
// Value: a 128-byte header, then the object's bytes:
//        magic "KVSTRL2\0", format version, flags (bit 0: carries a state
//        image), object length, the full chunk key (namespace, rank, hash),
//        XXH3-64 of the object, 20 reserved zero bytes, XXH3-64 of all the
//        header before it.
// A value whose header, length or checksum does not match what the reader
// expects is refused: a miss, never loaded.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <kvstrand/chunk_keys.hpp>

namespace kvstrand::l2 {

inline constexpr std::uint32_t kChunkValueVersion = 1;
inline constexpr std::size_t kChunkHeaderBytes = 128;

std::string redis_key_of(const kv::ChunkKey& key);

// The header and the object's bytes, in one string (the SET's value).
std::string encode_chunk_value(const kv::ChunkKey& key, bool has_image, std::span<const std::byte> object);

struct ChunkValue {
  bool has_image = false;
  std::span<const std::byte> object;  // into the value given to decode
};
// The object in `value` if it is the chunk `key` of `object_bytes` bytes,
// whole and unaltered; else none, with the reason in `why`.
std::optional<ChunkValue> decode_chunk_value(std::string_view value, const kv::ChunkKey& key,
                                             std::uint64_t object_bytes, std::string* why);

}  // namespace kvstrand::l2
