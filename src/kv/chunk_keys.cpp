#include <kvstrand/chunk_keys.hpp>

#include <openssl/evp.h>

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
  EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~Impl() {
    EVP_MD_CTX_free(ctx);
    EVP_MD_free(md);
  }
};

ChunkHasher::ChunkHasher() : impl_(std::make_unique<Impl>()) {
  if (impl_->md == nullptr || impl_->ctx == nullptr) throw std::runtime_error("kvstrand: OpenSSL has no SHA-256");
}
ChunkHasher::~ChunkHasher() = default;

Digest ChunkHasher::next(const Digest& ns, const Digest& prev, std::span<const std::uint32_t> tokens) {
  Digest out{};
  unsigned len = 0;
  EVP_MD_CTX* c = impl_->ctx;
  if (EVP_DigestInit_ex2(c, impl_->md, nullptr) != 1 || EVP_DigestUpdate(c, ns.data(), ns.size()) != 1 ||
      EVP_DigestUpdate(c, prev.data(), prev.size()) != 1 ||
      EVP_DigestUpdate(c, tokens.data(), tokens.size_bytes()) != 1 ||
      EVP_DigestFinal_ex(c, reinterpret_cast<unsigned char*>(out.data()), &len) != 1 || len != out.size())
    throw std::runtime_error("kvstrand: SHA-256 failed");
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
  std::vector<ChunkKey> keys;
  for (const Digest& h : hasher.hashes(ns, tokens, l.chunk_tokens)) keys.push_back({ns, kv_rank_of(l), h});
  return keys;
}

}  // namespace kvstrand::kv
