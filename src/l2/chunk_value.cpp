#include "l2/chunk_value.hpp"
#include "tier/object_checksum.hpp"
#include "tier/object_header.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>

namespace kvstrand::l2 {

namespace {

using tier::kMacNonceAt;
using tier::kMacNonceBytes;
using tier::kMacTagAt;
using tier::kMacTagBytes;

// The MAC of a value: GMAC (AES-256-GCM over additional data only) of the
// header's first kMacNonceAt bytes and the object, under a key of its own,
// HMAC-SHA-256(key, "kvstrand-l2-mac" || nonce), with the value's random
// 96-bit nonce as GCM's IV. GHASH runs at several times SHA-256's speed
// (docs/PERFORMANCE.md, "L2 on Redis"); a key used for one value only keeps
// GCM's limit on random IVs per key out of reach. Into `tag`; false if
// OpenSSL failed (the caller writes no MAC, or refuses).
bool tag_of(const MacKey& key, const char* header, std::span<const std::byte> object, unsigned char* tag) {
  static constexpr char kLabel[] = "kvstrand-l2-mac";
  unsigned char in[sizeof kLabel - 1 + kMacNonceBytes];
  std::memcpy(in, kLabel, sizeof kLabel - 1);
  std::memcpy(in + sizeof kLabel - 1, header + kMacNonceAt, kMacNonceBytes);
  unsigned char subkey[EVP_MAX_MD_SIZE];
  unsigned int subkey_bytes = 0;
  if (HMAC(EVP_sha256(), key.secret.data(), static_cast<int>(key.secret.size()), in, sizeof in, subkey,
           &subkey_bytes) == nullptr || subkey_bytes != 32)
    return false;
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  int n = 0;
  bool ok = ctx != nullptr &&
            EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nullptr, subkey,
                               reinterpret_cast<const unsigned char*>(header + kMacNonceAt)) == 1 &&
            EVP_EncryptUpdate(ctx, nullptr, &n, reinterpret_cast<const unsigned char*>(header), kMacNonceAt) == 1;
  // Additional data in pieces an int can count.
  for (std::size_t at = 0; ok && at < object.size(); at += 1u << 30) {
    const int piece = static_cast<int>(std::min<std::size_t>(object.size() - at, 1u << 30));
    ok = EVP_EncryptUpdate(ctx, nullptr, &n, reinterpret_cast<const unsigned char*>(object.data()) + at, piece) == 1;
  }
  unsigned char none[16];
  ok = ok && EVP_EncryptFinal_ex(ctx, none, &n) == 1 &&
       EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kMacTagBytes), tag) == 1;
  EVP_CIPHER_CTX_free(ctx);
  OPENSSL_cleanse(subkey, sizeof subkey);
  return ok;
}

}  // namespace

std::string redis_key_of(const kv::ChunkKey& key) {
  return "kvstrand:v1:{" + kv::to_hex(key.hash) + "}:" + kv::to_hex(key.ns) + ":" + std::to_string(key.kv_rank);
}

std::string redis_description_key_of(const kv::ChunkKey& key) { return redis_key_of(key) + ":events"; }

std::string encode_chunk_value(const kv::ChunkKey& key, bool has_image, std::span<const std::byte> object,
                               const MacKey* mac) {
  std::string v(kChunkHeaderBytes + object.size(), '\0');
  auto* h = reinterpret_cast<std::byte*>(v.data());
  tier::start_object_header(h, key, has_image, object.size());
  std::memcpy(v.data() + kChunkHeaderBytes, object.data(), object.size());
  // With a key: the flag first (the MAC covers it), a fresh nonce, the tag.
  // A MAC OpenSSL could not make is left out, flag and all: nodes with the
  // key refuse such a value (a miss), never trust it.
  bool macd = false;
  if (mac != nullptr) {
    tier::mark_object_mac(h, true);
    macd = RAND_bytes(reinterpret_cast<unsigned char*>(h + kMacNonceAt), kMacNonceBytes) == 1 &&
           tag_of(*mac, v.data(), object, reinterpret_cast<unsigned char*>(h + kMacTagAt));
    if (!macd) {
      tier::mark_object_mac(h, false);
      std::memset(h + kMacNonceAt, 0, kMacNonceBytes + kMacTagBytes);
    }
  }
  if (!macd) tier::put_object_sum(h, tier::object_checksum(v.data() + kChunkHeaderBytes, object.size()));
  tier::seal_object_header(h);
  return v;
}

common::Expected<ChunkValue> decode_chunk_value(std::string_view value, const kv::ChunkKey& key,
                                                std::uint64_t object_bytes, const MacKey* mac, Refusal* refusal) {
  if (refusal != nullptr) *refusal = Refusal::corrupt;
  if (value.size() < kChunkHeaderBytes) {
    return common::unexpected("shorter than a header (" + std::to_string(value.size()) + " B)");
  }
  const char* h = value.data();
  auto header = tier::read_object_header(std::as_bytes(std::span(h, kChunkHeaderBytes)));
  if (!header) return common::unexpected(header.why());
  const std::uint64_t length = header->object_bytes;
  if (length != object_bytes || value.size() - kChunkHeaderBytes != length) {
    return common::unexpected("object of " + std::to_string(length) + " B in a value of " + std::to_string(value.size()) +
           " B, expected " + std::to_string(object_bytes) + " B");
  }
  if (!(header->key == key)) return common::unexpected("another chunk's value");
  const char* payload = h + kChunkHeaderBytes;
  const std::span<const std::byte> object{reinterpret_cast<const std::byte*>(payload), length};
  const bool has_tag = header->has_mac;
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
    unsigned char tag[kMacTagBytes];
    if (!tag_of(*mac, h, object, tag) || CRYPTO_memcmp(tag, h + kMacTagAt, kMacTagBytes) != 0) {
      return common::unexpected("its MAC does not match: not written under this node's --l2-mac-key-file");
    }
  } else if (header->object_sum != tier::object_checksum(payload, length)) {
    return common::unexpected("payload checksum mismatch");
  }
  ChunkValue out;
  out.has_image = header->has_image;
  out.object = object;
  return out;
}

}  // namespace kvstrand::l2
