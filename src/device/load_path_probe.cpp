#include "device/load_path_probe.hpp"

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>

#include <spdlog/fmt/fmt.h>

#include "device/backend.hpp"
#include "device/device_buffer.hpp"
#include "device/pinned_buffer.hpp"
#include "device/stream.hpp"

namespace kvstrand::device {

std::vector<std::uint64_t> LoadPathProbeOptions::default_segment_sizes() {
  std::vector<std::uint64_t> sizes;
  for (std::uint64_t b = 4096; b <= (4u << 20); b *= 2) sizes.push_back(b);
  return sizes;
}

std::vector<Segment> probe_layout(std::byte* host, std::byte* device, std::uint64_t probe_bytes,
                                  std::uint64_t size) {
  const std::uint64_t n = size == 0 ? 0 : probe_bytes / size;
  // The host side in order (a load reads whole arena objects), the device
  // side shuffled (a pool's blocks come in whatever order the engine freed
  // them): the copy engines' rate falls with scattered destinations, 1.7 of
  // one copy for 32 KiB segments on an H100 where the same segments in
  // order ran near 1.1.
  std::vector<std::uint64_t> slot(n);
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), std::mt19937_64(size));
  std::vector<Segment> segs(n);
  for (std::uint64_t i = 0; i < n; ++i) segs[i] = {host + i * size, device + 2 * slot[i] * size, size};
  return segs;
}

namespace {

using Clock = std::chrono::steady_clock;

// GB/s of the best round; 0 when the path is not there.
Result<double> rate(Stream& stream, std::span<const Segment> segs, backend::BatchVia via,
                    const LoadPathProbeOptions& o) {
  if (!backend::batch_via_available(via)) return 0.0;
  std::uint64_t bytes = 0;
  for (const Segment& g : segs) bytes += g.bytes;
  // One copy first, untimed: the first launch of the kernel and the first
  // batched call set things up once.
  if (Status s = backend::memcpy_batch_async(segs, CopyKind::host_to_device, stream.native(), via); !s.ok()) return s;
  if (Status s = stream.synchronize(); !s.ok()) return s;
  double best = 0;
  for (int r = 0; r < o.rounds; ++r) {
    const auto t0 = Clock::now();
    for (int c = 0; c < o.copies_per_round; ++c)
      if (Status s = backend::memcpy_batch_async(segs, CopyKind::host_to_device, stream.native(), via); !s.ok())
        return s;
    if (Status s = stream.synchronize(); !s.ok()) return s;
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::max(best, static_cast<double>(bytes) * o.copies_per_round / seconds / 1e9);
  }
  return best;
}

}  // namespace

Result<LoadPaths> measure_load_paths(const LoadPathProbeOptions& o) {
  const auto t0 = Clock::now();
  auto host = PinnedBuffer::allocate(o.probe_bytes);
  if (!host.ok()) return host.status();
  // Twice the bytes: each segment lands one segment's length after the
  // last one's end, so that none continues another.
  auto device = DeviceBuffer::allocate(2 * o.probe_bytes);
  if (!device.ok()) return device.status();
  auto stream = Stream::create();
  if (!stream.ok()) return stream.status();
  LoadPaths out;
  for (const std::uint64_t size : o.segment_bytes) {
    if (size == 0 || o.probe_bytes / size < 2) continue;
    const std::vector<Segment> segs = probe_layout(host->data(), device->data(), o.probe_bytes, size);
    // A failure says which size and path: on a GPU the first error of a
    // stream is often the one the context dies of.
    auto failed = [size](const char* path, const Status& s) {
      return Status{static_cast<Errc>(s.code().value()), s.call(),
                    fmt::format("probing {} B segments by the {}: {}", size, path, s.message())};
    };
    auto kernel = rate(*stream, segs, backend::BatchVia::kernel, o);
    if (!kernel.ok()) return failed("kernel", kernel.status());
    auto dma = rate(*stream, segs, backend::BatchVia::dma_batch, o);
    if (!dma.ok()) return failed("DMA batch", dma.status());
    out.classes.push_back({size, *kernel, *dma, choose(*kernel, *dma)});
  }
  if (out.classes.empty())
    return Status{Errc::invalid_value, "measure_load_paths", "no segment size fits twice in probe_bytes"};
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  out.how = fmt::format("in {:.2f} s", seconds);
  return out;
}

}  // namespace kvstrand::device
