#include <kvstrand/chunk_keys.hpp>

// SHA256_Init/Update/Final are deprecated in OpenSSL 3 in favour of EVP, but
// EVP's per-digest init and final (a provider dispatch each) are paid once per
// chunk key, and a key is a single short digest: the low-level calls keep key
// computation at one-shot hashing speed (docs/PERFORMANCE.md, chunk keys).
#include <openssl/sha.h>

#include <bit>
#include <cstring>
#include <stdexcept>


namespace kvstrand::kv {

static_assert(std::endian::native == std::endian::little, "token bytes are hashed as stored: little-endian only");

std::string to_hex(const Digest& d) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(64);
  for (std::byte b : d) {
    s += digits[static_cast<unsigned>(b) >> 4];
    s += digits[static_cast<unsigned>(b) & 15];
  }
  return s;
}

struct ChunkHasher::Impl {
  SHA256_CTX ctx;
};

ChunkHasher::ChunkHasher() : impl_(std::make_unique<Impl>()) {}
ChunkHasher::~ChunkHasher() = default;

Digest ChunkHasher::next(const Digest& ns, const Digest& prev, std::span<const std::uint32_t> tokens) {
  Digest out{};
  SHA256_CTX* c = &impl_->ctx;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  if (SHA256_Init(c) != 1 || SHA256_Update(c, ns.data(), ns.size()) != 1 ||
      SHA256_Update(c, prev.data(), prev.size()) != 1 || SHA256_Update(c, tokens.data(), tokens.size_bytes()) != 1 ||
      SHA256_Final(reinterpret_cast<unsigned char*>(out.data()), c) != 1)
    throw std::runtime_error("kvstrand: SHA-256 failed");
#pragma GCC diagnostic pop
  return out;
}

std::vector<Digest> ChunkHasher::hashes(const Digest& ns, std::span<const std::uint32_t> tokens,
                                        std::uint32_t chunk_tokens, const Digest& prev) {
  std::vector<Digest> out;
  if (chunk_tokens == 0) return out;
  out.reserve(tokens.size() / chunk_tokens);
  Digest h = prev;
  for (std::size_t at = 0; at + chunk_tokens <= tokens.size(); at += chunk_tokens) {
    h = next(ns, h, tokens.subspan(at, chunk_tokens));
    out.push_back(h);
  }
  return out;
}

std::uint32_t kv_rank_of(const Layout& l) noexcept { return l.replicated_across_tp ? 0 : l.tp_rank; }
bool writes_to_tier(const Layout& l) noexcept { return !l.replicated_across_tp || l.tp_rank == 0; }

std::vector<ChunkKey> chunk_keys(const Layout& l, const Digest& ns, std::span<const std::uint32_t> tokens) {
  thread_local ChunkHasher hasher;
  const std::vector<Digest> hashes = hasher.hashes(ns, tokens, l.chunk_tokens);
  std::vector<ChunkKey> keys;
  keys.reserve(hashes.size());
  const std::uint32_t rank = kv_rank_of(l);
  for (const Digest& h : hashes) keys.push_back({ns, rank, h});
  return keys;
}

}  // namespace kvstrand::kv
