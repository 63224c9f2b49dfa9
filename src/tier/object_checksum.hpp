// XXH3-64 of an object's bytes: the value the L2 and disk headers carry,
// the same on every machine, computed with AVX2 where the CPU has it (twice
// the SSE2 build's speed: docs/PERFORMANCE.md, "The disk tier"). The disk
// tier's strand spends most of its time here.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvstrand::tier {

std::uint64_t object_checksum(const void* p, std::size_t n) noexcept;

}  // namespace kvstrand::tier
