#include "l2/chunk_value.hpp"
#include "l2/object_checksum.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>

namespace kvstrand::l2 {

namespace {

constexpr char kMagic[8] = {'K', 'V', 'S', 'T', 'R', 'L', '2', '\0'};

// Field offsets in the header (little-endian integers). A value with a MAC
// keeps its nonce where the object's checksum would be (the MAC covers the
// object), then its tag.
constexpr std::size_t kVersionAt = 8, kFlagsAt = 12, kLengthAt = 16, kNsAt = 24, kRankAt = 56, kHashAt = 60,
                      kPayloadSumAt = 92, kHeaderSumAt = 120;  // 100..119: zero, reserved, without a MAC
constexpr std::size_t kNonceAt = 92, kNonceBytes = 12, kTagAt = 104, kTagBytes = 16;
static_assert(kNonceAt + kNonceBytes == kTagAt && kTagAt + kTagBytes == kHeaderSumAt &&
              kHeaderSumAt + 8 == kChunkHeaderBytes);
constexpr std::uint32_t kFlagImage = 1u, kFlagMac = 2u;

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

// The MAC of a value: GMAC (AES-256-GCM over additional data only) of the
// header's first kNonceAt bytes and the object, under a key of its own,
// HMAC-SHA-256(key, "kvstrand-l2-mac" || nonce), with the value's random
// 96-bit nonce as GCM's IV. GHASH runs at several times SHA-256's speed
// (docs/PERFORMANCE.md, "L2 on Redis"); a key used for one value only keeps
// GCM's limit on random IVs per key out of reach. Into `tag`; false if
// OpenSSL failed (the caller writes no MAC, or refuses).
bool tag_of(const MacKey& key, const char* header, std::span<const std::byte> object, unsigned char* tag) {
  static constexpr char kLabel[] = "kvstrand-l2-mac";
  unsigned char in[sizeof kLabel - 1 + kNonceBytes];
  std::memcpy(in, kLabel, sizeof kLabel - 1);
  std::memcpy(in + sizeof kLabel - 1, header + kNonceAt, kNonceBytes);
  unsigned char subkey[EVP_MAX_MD_SIZE];
  unsigned int subkey_bytes = 0;
  if (HMAC(EVP_sha256(), key.secret.data(), static_cast<int>(key.secret.size()), in, sizeof in, subkey,
           &subkey_bytes) == nullptr || subkey_bytes != 32)
    return false;
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  int n = 0;
  bool ok = ctx != nullptr &&
            EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, subkey,
                               reinterpret_cast<const unsigned char*>(header + kNonceAt)) == 1 &&
            EVP_EncryptUpdate(ctx, nullptr, &n, reinterpret_cast<const unsigned char*>(header), kNonceAt) == 1;
  // Additional data in pieces an int can count.
  for (std::size_t at = 0; ok && at < object.size(); at += 1u << 30) {
    const int piece = static_cast<int>(std::min<std::size_t>(object.size() - at, 1u << 30));
    ok = EVP_EncryptUpdate(ctx, nullptr, &n, reinterpret_cast<const unsigned char*>(object.data()) + at, piece) == 1;
  }
  unsigned char none[16];
  ok = ok && EVP_EncryptFinal_ex(ctx, none, &n) == 1 &&
       EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kTagBytes), tag) == 1;
  EVP_CIPHER_CTX_free(ctx);
  OPENSSL_cleanse(subkey, sizeof subkey);
  return ok;
}

}  // namespace

std::string redis_key_of(const kv::ChunkKey& key) {
  return "kvstrand:v1:{" + kv::to_hex(key.hash) + "}:" + kv::to_hex(key.ns) + ":" + std::to_string(key.kv_rank);
}

namespace {
// The header's fields but its checksums (and MAC), into zeroed `h`.
void fill_header(char* h, const kv::ChunkKey& key, bool has_image, std::uint64_t length) {
  std::memcpy(h, kMagic, sizeof kMagic);
  put<std::uint32_t>(h + kVersionAt, kChunkValueVersion);
  put<std::uint32_t>(h + kFlagsAt, has_image ? kFlagImage : 0u);
  put<std::uint64_t>(h + kLengthAt, length);
  std::memcpy(h + kNsAt, key.ns.data(), key.ns.size());
  put<std::uint32_t>(h + kRankAt, key.kv_rank);
  std::memcpy(h + kHashAt, key.hash.data(), key.hash.size());
}
}  // namespace

void write_chunk_header(const kv::ChunkKey& key, bool has_image, std::span<const std::byte> object,
                        std::byte* header) {
  char* h = reinterpret_cast<char*>(header);
  std::memset(h, 0, kChunkHeaderBytes);
  fill_header(h, key, has_image, object.size());
  put<std::uint64_t>(h + kPayloadSumAt, object_checksum(object.data(), object.size()));
  put<std::uint64_t>(h + kHeaderSumAt, XXH3_64bits(h, kHeaderSumAt));
}

common::Expected<ChunkHeader> read_chunk_header(std::span<const std::byte> header) {
  if (header.size() < kChunkHeaderBytes) return common::unexpected("shorter than a header");
  const char* h = reinterpret_cast<const char*>(header.data());
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0) return common::unexpected("no kvstrand magic");
  if (get<std::uint64_t>(h + kHeaderSumAt) != XXH3_64bits(h, kHeaderSumAt))
    return common::unexpected("header checksum mismatch");
  if (get<std::uint32_t>(h + kVersionAt) != kChunkValueVersion)
    return common::unexpected("format version " + std::to_string(get<std::uint32_t>(h + kVersionAt)));
  const std::uint32_t flags = get<std::uint32_t>(h + kFlagsAt);
  if ((flags & kFlagMac) != 0) return common::unexpected("it carries a MAC");
  ChunkHeader out;
  std::memcpy(out.key.ns.data(), h + kNsAt, out.key.ns.size());
  out.key.kv_rank = get<std::uint32_t>(h + kRankAt);
  std::memcpy(out.key.hash.data(), h + kHashAt, out.key.hash.size());
  out.has_image = (flags & kFlagImage) != 0;
  out.object_bytes = get<std::uint64_t>(h + kLengthAt);
  out.object_sum = get<std::uint64_t>(h + kPayloadSumAt);
  return out;
}

bool object_matches(const ChunkHeader& h, std::span<const std::byte> object) {
  return object.size() == h.object_bytes && object_checksum(object.data(), object.size()) == h.object_sum;
}

std::string encode_chunk_value(const kv::ChunkKey& key, bool has_image, std::span<const std::byte> object,
                               const MacKey* mac) {
  std::string v(kChunkHeaderBytes + object.size(), '\0');
  char* h = v.data();
  fill_header(h, key, has_image, object.size());
  std::memcpy(h + kChunkHeaderBytes, object.data(), object.size());
  // With a key: the flag first (the MAC covers it), a fresh nonce, the tag.
  // A MAC OpenSSL could not make is left out, flag and all: nodes with the
  // key refuse such a value (a miss), never trust it.
  bool macd = false;
  if (mac != nullptr) {
    put<std::uint32_t>(h + kFlagsAt, get<std::uint32_t>(h + kFlagsAt) | kFlagMac);
    macd = RAND_bytes(reinterpret_cast<unsigned char*>(h + kNonceAt), kNonceBytes) == 1 &&
           tag_of(*mac, h, object, reinterpret_cast<unsigned char*>(h + kTagAt));
    if (!macd) {
      put<std::uint32_t>(h + kFlagsAt, get<std::uint32_t>(h + kFlagsAt) & ~kFlagMac);
      std::memset(h + kNonceAt, 0, kNonceBytes + kTagBytes);
    }
  }
  if (!macd) put<std::uint64_t>(h + kPayloadSumAt, object_checksum(h + kChunkHeaderBytes, object.size()));
  put<std::uint64_t>(h + kHeaderSumAt, XXH3_64bits(h, kHeaderSumAt));
  return v;
}

common::Expected<ChunkValue> decode_chunk_value(std::string_view value, const kv::ChunkKey& key,
                                                std::uint64_t object_bytes, const MacKey* mac, Refusal* refusal) {
  if (refusal != nullptr) *refusal = Refusal::corrupt;
  if (value.size() < kChunkHeaderBytes) {
    return common::unexpected("shorter than a header (" + std::to_string(value.size()) + " B)");
  }
  const char* h = value.data();
  if (std::memcmp(h, kMagic, sizeof kMagic) != 0) {
    return common::unexpected("no kvstrand magic");
  }
  if (get<std::uint64_t>(h + kHeaderSumAt) != XXH3_64bits(h, kHeaderSumAt)) {
    return common::unexpected("header checksum mismatch");
  }
  if (get<std::uint32_t>(h + kVersionAt) != kChunkValueVersion) {
    return common::unexpected("format version " + std::to_string(get<std::uint32_t>(h + kVersionAt)));
  }
  const auto length = get<std::uint64_t>(h + kLengthAt);
  if (length != object_bytes || value.size() - kChunkHeaderBytes != length) {
    return common::unexpected("object of " + std::to_string(length) + " B in a value of " + std::to_string(value.size()) +
           " B, expected " + std::to_string(object_bytes) + " B");
  }
  if (std::memcmp(h + kNsAt, key.ns.data(), key.ns.size()) != 0 || get<std::uint32_t>(h + kRankAt) != key.kv_rank ||
      std::memcmp(h + kHashAt, key.hash.data(), key.hash.size()) != 0) {
    return common::unexpected("another chunk's value");
  }
  const char* payload = h + kChunkHeaderBytes;
  const std::span<const std::byte> object{reinterpret_cast<const std::byte*>(payload), length};
  const std::uint32_t flags = get<std::uint32_t>(h + kFlagsAt);
  const bool has_tag = (flags & kFlagMac) != 0;
  if (mac != nullptr || has_tag) {
    if (refusal != nullptr) *refusal = Refusal::unauthenticated;
    if (mac == nullptr) {
      return common::unexpected("it carries a MAC and this node has no key to check it (--l2-mac-key-file)");
    }
    if (!has_tag) {
      return common::unexpected("it carries no MAC and this node requires one (--l2-mac-key-file)");
    }
    // Constant time: a forger learns nothing from how long a refusal took.
    // The MAC covers the object, so its checksum adds nothing here.
    unsigned char tag[kTagBytes];
    if (!tag_of(*mac, h, object, tag) || CRYPTO_memcmp(tag, h + kTagAt, kTagBytes) != 0) {
      return common::unexpected("its MAC does not match: not written under this node's --l2-mac-key-file");
    }
  } else if (get<std::uint64_t>(h + kPayloadSumAt) != object_checksum(payload, length)) {
    return common::unexpected("payload checksum mismatch");
  }
  ChunkValue out;
  out.has_image = (flags & kFlagImage) != 0;
  out.object = object;
  return out;
}

}  // namespace kvstrand::l2
