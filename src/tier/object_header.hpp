// The 128-byte header kvstrand keeps with a stored object outside the arena:
// before it in an L2 value, in the block before it on the disk. It says what
// the object is before anyone trusts it.
//
// magic "KVSTRL2\0", format version, flags (bit 0: carries a state image;
// bit 1: carries a MAC), object length, the full chunk key (namespace, rank,
// hash), XXH3-64 of the object then its tenant's tag (TenantBook::tag_of, 0:
// none; headers written before it have 0 there) and 12 reserved zero bytes
// (without a MAC)
// or the MAC's 12-byte nonce and 16-byte tag (with one, L2's:
// l2/chunk_value), XXH3-64 of all the header before it. Little-endian
// integers: an L2 value is read by other machines.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <kvstrand/chunk_keys.hpp>
#include "common/expected.hpp"

namespace kvstrand::tier {

inline constexpr std::size_t kObjectHeaderBytes = 128;
inline constexpr std::uint32_t kObjectFormatVersion = 1;
// With a MAC: its nonce where the object's checksum would be, then its tag;
// it covers the header before the nonce (and the object).
inline constexpr std::size_t kMacNonceAt = 92, kMacNonceBytes = 12, kMacTagAt = 104, kMacTagBytes = 16;

struct ObjectHeader {
  kv::ChunkKey key;
  bool has_image = false;
  bool has_mac = false;
  std::uint64_t object_bytes = 0;
  std::uint64_t object_sum = 0;  // without a MAC
  std::uint64_t tenant_tag = 0;  // without a MAC (the disk's): whose object it is
};

// Into `h` (kObjectHeaderBytes, zeroed here): every field but the object's
// checksum, the MAC and the header's checksum.
void start_object_header(std::byte* h, const kv::ChunkKey& key, bool has_image, std::uint64_t length);
// The MAC flag (its nonce and tag are the caller's), or none.
void mark_object_mac(std::byte* h, bool has_mac);
void put_object_sum(std::byte* h, std::uint64_t sum);
// The header's own checksum: written last.
void seal_object_header(std::byte* h);

// A whole header without a MAC, for an object kept apart from it (the disk).
void write_object_header(const kv::ChunkKey& key, bool has_image, std::span<const std::byte> object, std::byte* h,
                         std::uint64_t tenant_tag = 0);

// What a header says if it is whole (magic, its checksum, version); else why
// not ("no kvstrand magic", "header checksum mismatch", "format version N").
common::Expected<ObjectHeader> read_object_header(std::span<const std::byte> h);
// Whether `object` is the one `h` (without a MAC) describes: its length and checksum.
bool object_matches(const ObjectHeader& h, std::span<const std::byte> object);

}  // namespace kvstrand::tier
