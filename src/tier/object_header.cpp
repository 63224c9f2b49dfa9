#include "tier/object_header.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <cstring>
#include <string>

#include "tier/object_checksum.hpp"

namespace kvstrand::tier {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'T', 'R', 'L', '2', '\0'};
constexpr std::size_t kVersionAt = 8, kFlagsAt = 12, kLengthAt = 16, kNsAt = 24, kRankAt = 56, kHashAt = 60,
                      kObjectSumAt = 92, kTenantAt = 100, kHeaderSumAt = 120;  // without a MAC: 100..107 the
                                                                               // tenant tag, 108..119 zero
static_assert(kMacNonceAt == kObjectSumAt && kMacNonceAt + kMacNonceBytes == kMacTagAt &&
              kMacTagAt + kMacTagBytes == kHeaderSumAt && kHeaderSumAt + 8 == kObjectHeaderBytes);
constexpr std::uint32_t kFlagImage = 1u, kFlagMac = 2u;

template <class T>
void put(std::byte* at, T v) {
  for (std::size_t i = 0; i < sizeof(T); ++i) at[i] = static_cast<std::byte>((static_cast<std::uint64_t>(v) >> (8 * i)) & 0xff);
}
template <class T>
T get(const std::byte* at) {
  std::uint64_t v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) v |= static_cast<std::uint64_t>(at[i]) << (8 * i);
  return static_cast<T>(v);
}

}  // namespace

void start_object_header(std::byte* h, const kv::ChunkKey& key, bool has_image, std::uint64_t length) {
  std::memset(h, 0, kObjectHeaderBytes);
  std::memcpy(h, kMagic, sizeof kMagic);
  put<std::uint32_t>(h + kVersionAt, kObjectFormatVersion);
  put<std::uint32_t>(h + kFlagsAt, has_image ? kFlagImage : 0u);
  put<std::uint64_t>(h + kLengthAt, length);
  std::memcpy(h + kNsAt, key.ns.data(), key.ns.size());
  put<std::uint32_t>(h + kRankAt, key.kv_rank);
  std::memcpy(h + kHashAt, key.hash.data(), key.hash.size());
}

void mark_object_mac(std::byte* h, bool has_mac) {
  const std::uint32_t flags = get<std::uint32_t>(h + kFlagsAt);
  put<std::uint32_t>(h + kFlagsAt, has_mac ? flags | kFlagMac : flags & ~kFlagMac);
}

void put_object_sum(std::byte* h, std::uint64_t sum) { put<std::uint64_t>(h + kObjectSumAt, sum); }

void seal_object_header(std::byte* h) { put<std::uint64_t>(h + kHeaderSumAt, XXH3_64bits(h, kHeaderSumAt)); }

void write_object_header(const kv::ChunkKey& key, bool has_image, std::span<const std::byte> object, std::byte* h,
                         std::uint64_t tenant_tag) {
  start_object_header(h, key, has_image, object.size());
  put_object_sum(h, object_checksum(object.data(), object.size()));
  put<std::uint64_t>(h + kTenantAt, tenant_tag);
  seal_object_header(h);
}

common::Expected<ObjectHeader> read_object_header(std::span<const std::byte> header) {
  if (header.size() < kObjectHeaderBytes) return common::unexpected("shorter than a header");
  const std::byte* h = header.data();
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0) return common::unexpected("no kvstrand magic");
  if (get<std::uint64_t>(h + kHeaderSumAt) != XXH3_64bits(h, kHeaderSumAt))
    return common::unexpected("header checksum mismatch");
  if (get<std::uint32_t>(h + kVersionAt) != kObjectFormatVersion)
    return common::unexpected("format version " + std::to_string(get<std::uint32_t>(h + kVersionAt)));
  const std::uint32_t flags = get<std::uint32_t>(h + kFlagsAt);
  ObjectHeader out;
  std::memcpy(out.key.ns.data(), h + kNsAt, out.key.ns.size());
  out.key.kv_rank = get<std::uint32_t>(h + kRankAt);
  std::memcpy(out.key.hash.data(), h + kHashAt, out.key.hash.size());
  out.has_image = (flags & kFlagImage) != 0;
  out.has_mac = (flags & kFlagMac) != 0;
  out.object_bytes = get<std::uint64_t>(h + kLengthAt);
  out.object_sum = out.has_mac ? 0 : get<std::uint64_t>(h + kObjectSumAt);
  out.tenant_tag = out.has_mac ? 0 : get<std::uint64_t>(h + kTenantAt);
  return out;
}

bool object_matches(const ObjectHeader& h, std::span<const std::byte> object) {
  return !h.has_mac && object.size() == h.object_bytes && object_checksum(object.data(), object.size()) == h.object_sum;
}

}  // namespace kvstrand::tier
