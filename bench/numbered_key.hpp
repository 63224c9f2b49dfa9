// Chunk key number i for the index benchmarks (bench_index, bench_recovery,
// bench_disk_recovery): chunk hashes are SHA-256 output, so the number is
// spread over all the hash's bytes, as a real key's would be.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>

#include <kvstrand/chunk_keys.hpp>

namespace kvstrand::bench {

inline kv::ChunkKey numbered_key(std::uint64_t i) {
  kv::ChunkKey k;
  std::mt19937_64 mix(i);
  for (std::size_t b = 0; b < k.hash.size(); b += 8) {
    const std::uint64_t v = mix();
    std::memcpy(k.hash.data() + b, &v, 8);
  }
  return k;
}

}  // namespace kvstrand::bench
