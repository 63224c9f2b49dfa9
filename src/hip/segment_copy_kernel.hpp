// The cuda backend's gather/scatter kernel: many (src, dst, bytes) segments
// in one launch, each copied by GPU threads through unified addresses (device
// memory, or pinned host memory the device maps). One launch replaces one
// DMA call a segment: the per-call cost (~2 us of host enqueue, and small
// copies running below link speed) is what keeps scattered loads from the
// PCIe limit. Compiled by nvcc; only backend_gpu.cpp (cuda) calls it.
#pragma once

#include <cstdint>

namespace kvstrand::hip::kernel {

struct KernelSegment {
  std::uint64_t src = 0;
  std::uint64_t dst = 0;
  std::uint64_t bytes = 0;
};

// Queues the copies on `stream` (a cudaStream_t); returns the cudaError_t of
// the launch (0 on success).
int segment_copy(const KernelSegment* segments, int count, void* stream);

}  // namespace kvstrand::hip::kernel
