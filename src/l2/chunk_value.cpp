#include "l2/chunk_value.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstring>

namespace kvstrand::l2 {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'T', 'R', 'L', '2', '\0'};

// Field offsets in the header (little-endian integers).
constexpr std::size_t kVersionAt = 8, kFlagsAt = 12, kLengthAt = 16, kNsAt = 24, kRankAt = 56, kHashAt = 60,
                      kPayloadSumAt = 92, kHeaderSumAt = 120;  // 100..119: zero, reserved
static_assert(kHeaderSumAt + 8 == kChunkHeaderBytes);

template <class T>
void put(char* at, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) at[i] = static_cast<char>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff);
}
template <class T>
T get(const char* at) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(at[i])) << (8 * i);
  return static_cast<T>(v);
}

}  // namespace

std::string redis_key_of(const kv::ChunkKey& key) {
  return "kvstrand:v1:{" + kv::to_hex(key.hash) + "}:" + kv::to_hex(key.ns) + ":" + std::to_string(key.kv_rank);
}

std::string encode_chunk_value(const kv::ChunkKey& key, bool has_image, std::span<const std::byte> object) {
  std::string v(kChunkHeaderBytes + object.size(), '\0');
  char* h = v.data();
  std::memcpy(h, kMagic, sizeof kMagic);
  put<std::uint32_t>(h + kVersionAt, kChunkValueVersion);
  put<std::uint32_t>(h + kFlagsAt, has_image ? 1u : 0u);
  put<std::uint64_t>(h + kLengthAt, object.size());
  std::memcpy(h + kNsAt, key.ns.data(), key.ns.size());
  put<std::uint32_t>(h + kRankAt, key.kv_rank);
  std::memcpy(h + kHashAt, key.hash.data(), key.hash.size());
  std::memcpy(h + kChunkHeaderBytes, object.data(), object.size());
  put<std::uint64_t>(h + kPayloadSumAt, XXH3_64bits(h + kChunkHeaderBytes, object.size()));
  put<std::uint64_t>(h + kHeaderSumAt, XXH3_64bits(h, kHeaderSumAt));
  return v;
}

std::optional<ChunkValue> decode_chunk_value(std::string_view value, const kv::ChunkKey& key,
                                             std::uint64_t object_bytes, std::string* why) {
  if (value.size() < kChunkHeaderBytes) {
    *why = "shorter than a header (" + std::to_string(value.size()) + " B)";
    return std::nullopt;
  }
  const char* h = value.data();
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0) {
    *why = "no kvstrand magic";
    return std::nullopt;
  }
  if (get<std::uint64_t>(h + kHeaderSumAt) != XXH3_64bits(h, kHeaderSumAt)) {
    *why = "header checksum mismatch";
    return std::nullopt;
  }
  if (get<std::uint32_t>(h + kVersionAt) != kChunkValueVersion) {
    *why = "format version " + std::to_string(get<std::uint32_t>(h + kVersionAt));
    return std::nullopt;
  }
  const auto length = get<std::uint64_t>(h + kLengthAt);
  if (length != object_bytes || value.size() - kChunkHeaderBytes != length) {
    *why = "object of " + std::to_string(length) + " B in a value of " + std::to_string(value.size()) +
           " B, expected " + std::to_string(object_bytes) + " B";
    return std::nullopt;
  }
  if (std::memcmp(h + kNsAt, key.ns.data(), key.ns.size()) != 0 || get<std::uint32_t>(h + kRankAt) != key.kv_rank ||
      std::memcmp(h + kHashAt, key.hash.data(), key.hash.size()) != 0) {
    *why = "another chunk's value";
    return std::nullopt;
  }
  const char* payload = h + kChunkHeaderBytes;
  if (get<std::uint64_t>(h + kPayloadSumAt) != XXH3_64bits(payload, length)) {
    *why = "payload checksum mismatch";
    return std::nullopt;
  }
  ChunkValue out;
  out.has_image = (get<std::uint32_t>(h + kFlagsAt) & 1u) != 0;
  out.object = {reinterpret_cast<const std::byte*>(payload), length};
  return out;
}

}  // namespace kvstrand::l2
