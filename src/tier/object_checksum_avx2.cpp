// Built with -mavx2 (CMakeLists.txt): only what xxhash.h defines, all of it
// internal here (XXH_INLINE_ALL), so that no AVX2 copy of a shared inline
// function can be picked by the linker for code that runs without AVX2.
#include <stddef.h>
#include <stdint.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvstrand::tier {

uint64_t object_checksum_avx2(const void* p, size_t n) noexcept { return XXH3_64bits(p, n); }

}  // namespace kvstrand::tier
