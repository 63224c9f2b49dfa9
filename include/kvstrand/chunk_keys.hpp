// Chunk keys: (namespace, kv_rank, chunk_hash).
//
// chunk_hash[i] = SHA-256(namespace || chunk_hash[i-1] || tokens of chunk i),
// with chunk_hash[-1] all zeros and tokens as little-endian uint32. Equal keys
// therefore imply equal whole prefixes under equal layouts, and a tenant
// (whose salt is in the namespace) cannot produce another tenant's key. Only
// full chunks get keys; a partial last chunk is never stored.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include <kvstrand/digest.hpp>
#include <kvstrand/layout.hpp>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand::kv {

struct ChunkKey {
  Digest ns{};
  std::uint32_t kv_rank = 0;
  Digest hash{};
  // Whole keys compared at once (the defaulted == goes a byte at a time:
  // the index compares one for every key it finds).
  friend bool operator==(const ChunkKey& a, const ChunkKey& b) noexcept {
    return std::memcmp(&a, &b, sizeof(ChunkKey)) == 0;
  }
};
static_assert(std::has_unique_object_representations_v<ChunkKey>, "== compares bytes: no padding");

// The rank part of keys: with replicated_across_tp every rank maps to rank 0.
std::uint32_t kv_rank_of(const Layout& layout) noexcept;
// Whether this rank writes to the tier: with replicated_across_tp only rank 0
// does (one copy, not one per rank); every rank reads.
bool writes_to_tier(const Layout& layout) noexcept;

// Incremental hasher; keep one per thread and reuse it (it holds an OpenSSL
// digest context, so hashing a chunk allocates nothing).
class ChunkHasher {
 public:
  ChunkHasher();
  ~ChunkHasher();
  ChunkHasher(const ChunkHasher&) = delete;
  ChunkHasher& operator=(const ChunkHasher&) = delete;

  Digest next(const Digest& ns, const Digest& prev, std::span<const std::uint32_t> chunk_tokens);

  // Hashes of every full chunk of `tokens`, continuing from `prev` (zeros
  // for a prompt's start).
  std::vector<Digest> hashes(const Digest& ns, std::span<const std::uint32_t> tokens, std::uint32_t chunk_tokens,
                             const Digest& prev = Digest{});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::vector<ChunkKey> chunk_keys(const Layout& layout, const Digest& ns, std::span<const std::uint32_t> tokens);

}  // namespace kvstrand::kv
#pragma GCC visibility pop
