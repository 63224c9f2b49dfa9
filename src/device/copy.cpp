#include "device/copy.hpp"

#include <atomic>

#include "device/load_path.hpp"
#include "device/stream.hpp"

namespace kvstrand::device {

const char* to_string(CopyKind k) noexcept {
  switch (k) {
    case CopyKind::host_to_device: return "H2D";
    case CopyKind::device_to_host: return "D2H";
    case CopyKind::device_to_device: return "D2D";
  }
  return "?";
}

namespace {

Status single(Stream& s, void* dst, const void* src, std::size_t bytes, CopyKind kind, const char* call) {
  if (bytes == 0) return {};
  if (dst == nullptr || src == nullptr) return {Errc::invalid_value, call, "null pointer"};
  return backend::memcpy_async(dst, src, bytes, kind, s.native());
}

}  // namespace

Status copy_h2d(Stream& s, void* d, const void* h, std::size_t n) {
  return single(s, d, h, n, CopyKind::host_to_device, "copy_h2d");
}
Status copy_d2h(Stream& s, void* h, const void* d, std::size_t n) {
  return single(s, h, d, n, CopyKind::device_to_host, "copy_d2h");
}
Status copy_d2d(Stream& s, void* d, const void* src, std::size_t n) {
  return single(s, d, src, n, CopyKind::device_to_device, "copy_d2d");
}

std::vector<Segment> coalesce(std::span<const Segment> segments) {
  std::vector<Segment> out;
  out.reserve(segments.size());
  for (const Segment& g : segments) {
    if (g.bytes == 0) continue;
    if (!out.empty()) {
      Segment& last = out.back();
      auto* src_end = static_cast<const std::byte*>(last.src) + last.bytes;
      auto* dst_end = static_cast<std::byte*>(last.dst) + last.bytes;
      if (src_end == g.src && dst_end == g.dst) {
        last.bytes += g.bytes;
        continue;
      }
    }
    out.push_back(g);
  }
  return out;
}

namespace {
std::atomic<BatchPath> g_path{BatchPath::fastest};
}

void set_batch_path(BatchPath p) noexcept { g_path.store(p, std::memory_order_relaxed); }
BatchPath batch_path() noexcept { return g_path.load(std::memory_order_relaxed); }
const char* fastest_batch_path() noexcept { return backend::fastest_batch_path(); }

Status copy_batch(Stream& s, CopyKind kind, std::span<const Segment> segments) {
  for (const Segment& g : segments) {
    if (g.bytes != 0 && (g.src == nullptr || g.dst == nullptr))
      return {Errc::invalid_value, "copy_batch", "null pointer in a segment"};
  }
  std::vector<Segment> merged = coalesce(segments);
  if (merged.empty()) return {};
  const BatchPath p = batch_path();
  backend::BatchVia via = p == BatchPath::fastest    ? backend::BatchVia::fastest
                          : p == BatchPath::dma_batch ? backend::BatchVia::dma_batch
                          : p == BatchPath::kernel    ? backend::BatchVia::kernel
                                                      : backend::BatchVia::per_segment;
  // A load's batch takes the path measured faster for its segments' sizes
  // on this host (load_path.hpp), once a Connector chose; before, the
  // built-in rule.
  if (via == backend::BatchVia::fastest && kind == CopyKind::host_to_device && merged.size() >= 2)
    if (const LoadPaths* paths = load_paths())
      via = paths->path_for(std::span<const Segment>(merged)) == LoadPath::kernel ? backend::BatchVia::kernel
                                                                                  : backend::BatchVia::dma_batch;
  return backend::memcpy_batch_async(merged, kind, s.native(), via);
}

}  // namespace kvstrand::device
