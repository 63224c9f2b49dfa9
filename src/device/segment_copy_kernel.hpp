// The cuda backend's gather/scatter kernel: many (src, dst, bytes) segments
// in one launch, each copied by GPU threads through unified addresses (device
// memory, or pinned host memory the device maps). One launch replaces one
// DMA call a segment: the per-call cost (~2 us of host enqueue, and small
// copies running below link speed) is what keeps scattered loads from the
// PCIe limit. Compiled by nvcc; only backend_gpu.cpp (cuda) calls it.
#pragma once

#include <cstdint>

namespace kvstrand::device::kernel {

struct KernelSegment {
  std::uint64_t src = 0;
  std::uint64_t dst = 0;
  std::uint64_t bytes = 0;
};

// Queues the copies on `stream` (a cudaStream_t); returns the cudaError_t of
// the launch (0 on success). Over 256 segments of at most 64 KiB that form
// a grid (device/segment_grid.hpp: a paged layout's planes x blocks), one
// launch with the grid in its parameters; otherwise segment_copy_listed.
int segment_copy(const KernelSegment* segments, int count, void* stream);

// The segments as listed: up to 1,024 travel in one launch's parameters;
// more go in one launch over a table copied to stream-ordered device memory
// first, or, where this driver cannot stage a table, in several launches'
// parameters. bench_gather's row for a grid sent without its grid.
int segment_copy_listed(const KernelSegment* segments, int count, void* stream);

// The segments in launch parameters only, 1,024 a launch: the fallback, and
// bench_gather's row for it.
int segment_copy_in_parameters(const KernelSegment* segments, int count, void* stream);

}  // namespace kvstrand::device::kernel
