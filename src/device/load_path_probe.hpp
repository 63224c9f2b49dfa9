// Times the two load paths (load_path.hpp) on this host. For each segment
// size: pinned host memory, in order, copied to device memory as scattered
// segments (apart from each other, in a shuffled order, so nothing
// coalesces: as a paged pool's blocks lie), by
// the gather kernel and by one DMA batch, the same bytes each way; each
// path's rate is its best of a few single copies, each timed from its call
// to its end as a load is: back-to-back copies would hide a DMA batch's
// submission behind the copy before it, which a load pays (on an H100 the
// back-to-back probe took the copy engines for 256 KiB segments, 6-8 %
// behind the kernel in two runs of four; docs/performance-history.md,
// thirty-first run). Blocks the calling thread: never
// on the reactor strand. Uses the calling thread's current device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "device/copy.hpp"
#include "device/load_path.hpp"

namespace kvstrand::device {

struct LoadPathProbeOptions {
  // 4 KiB to 4 MiB by powers of two: vLLM's paged blocks (4-32 KiB) to a
  // hybrid model's state (MiBs). A size over half of probe_bytes is skipped.
  std::vector<std::uint64_t> segment_bytes = default_segment_sizes();
  // The bytes each copy moves: about one reference load (141 segments of
  // ~148 KiB), so that every size runs at the rate a real load sees.
  std::uint64_t probe_bytes = 16ull << 20;
  int rounds = 5;
  int copies_per_round = 1;  // more: back-to-back copies in a round (bench_gather --probe-copies)

  static std::vector<std::uint64_t> default_segment_sizes();
};

Result<LoadPaths> measure_load_paths(const LoadPathProbeOptions& options = {});

// The probe's copy of `size`-byte segments: probe_bytes / size of them,
// `host` read in order, each landing in `device` (2 x probe_bytes) one
// segment's length apart from any other, in a shuffled order.
std::vector<Segment> probe_layout(std::byte* host, std::byte* device, std::uint64_t probe_bytes, std::uint64_t size);

}  // namespace kvstrand::device
