// Asynchronous copies between host and device memory.
//
// All copies are stream-ordered: they start after everything queued earlier on
// the stream and complete before anything queued later (an Event recorded
// after them completes only when they have). Host pointers must stay valid,
// and for full asynchrony should be pinned (PinnedBuffer), until an event
// recorded after the copy has completed.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

#include "device/status.hpp"

namespace kvstrand::device {

class Stream;

enum class CopyKind { host_to_device, device_to_host, device_to_device };

const char* to_string(CopyKind k) noexcept;

// One run of a batched copy.
struct Segment {
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t bytes = 0;
};

Status copy_h2d(Stream& s, void* device_dst, const void* host_src, std::size_t bytes);
Status copy_d2h(Stream& s, void* host_dst, const void* device_src, std::size_t bytes);
Status copy_d2d(Stream& s, void* device_dst, const void* device_src, std::size_t bytes);

// Copies every segment, in one submission where the backend allows it.
// Segments that continue each other on both sides are merged first, so a
// contiguous range split into blocks costs one copy. Zero-byte segments are
// skipped; a null pointer with bytes > 0 is refused before anything is queued.
Status copy_batch(Stream& s, CopyKind kind, std::span<const Segment> segments);

// How copy_batch moves more than one segment. `fastest`: loads (host to
// device) by the path measured fastest for their segments' size on this
// host, once a Connector chose one (load_path.hpp); otherwise, on cuda,
// device to host one batched DMA call (CUDA 12.8 and later), the other
// directions one gather/scatter kernel launch (the host side must be
// pinned memory the device maps); per-segment copies elsewhere.
// `per_segment`: one DMA call a segment everywhere. `dma_batch`: one batched
// DMA call (cudaMemcpyBatchAsync: the copy engines gather; CUDA 12.8 and
// later), per-segment where the backend has none. `kernel`: one
// gather/scatter kernel launch where the host side allows it. Process-wide;
// the benchmarks switch it to measure each in one run.
enum class BatchPath { fastest, per_segment, dma_batch, kernel };
void set_batch_path(BatchPath p) noexcept;
BatchPath batch_path() noexcept;
// What `fastest` uses on this backend, in words.
const char* fastest_batch_path() noexcept;

// The merge copy_batch applies, exposed for tests and benchmarks.
std::vector<Segment> coalesce(std::span<const Segment> segments);

}  // namespace kvstrand::device
