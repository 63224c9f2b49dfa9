#include "tier/object_checksum.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvstrand::tier {

#if defined(__x86_64__)
// object_checksum_avx2.cpp, the one file built with -mavx2: called only
// where the CPU has AVX2.
std::uint64_t object_checksum_avx2(const void* p, std::size_t n) noexcept;
#endif

std::uint64_t object_checksum(const void* p, std::size_t n) noexcept {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
  if (avx2) return object_checksum_avx2(p, n);
#endif
  return XXH3_64bits(p, n);
}

}  // namespace kvstrand::tier
