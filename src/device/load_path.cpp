#include "device/load_path.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "device/backend.hpp"
#include "device/load_path_probe.hpp"

namespace kvstrand::device {

const char* to_string(LoadPath p) noexcept { return p == LoadPath::kernel ? "kernel" : "dma-batch"; }

LoadPath choose(double kernel_gbps, double dma_batch_gbps) noexcept {
  if (dma_batch_gbps <= 0) return LoadPath::kernel;
  if (kernel_gbps <= 0) return LoadPath::dma_batch;
  return dma_batch_gbps > kernel_gbps * (1 + kCopyEnginesMustWinBy) ? LoadPath::dma_batch : LoadPath::kernel;
}

namespace {

// The class nearest `bytes` on a log scale: past the geometric mean of two
// neighbouring classes, the larger one's. Squares compared, on every load's
// path: no logarithm there. `classes` is not empty.
const LoadPathClass& nearest(const std::vector<LoadPathClass>& classes, std::uint64_t bytes) noexcept {
  using Wide = unsigned __int128;  // a square of 64-bit sizes
  const Wide b2 = static_cast<Wide>(bytes) * bytes;
  std::size_t i = 0;
  while (i + 1 < classes.size() && b2 >= static_cast<Wide>(classes[i].segment_bytes) * classes[i + 1].segment_bytes)
    ++i;
  return classes[i];
}

}  // namespace

LoadPath LoadPaths::path_for(std::uint64_t segment_bytes) const noexcept {
  return classes.empty() ? LoadPath::kernel : nearest(classes, segment_bytes).chosen;
}

LoadPath LoadPaths::path_for(std::span<const Segment> segments) const noexcept {
  if (classes.empty() || segments.empty()) return LoadPath::kernel;
  // A few segments stand for the batch (a load may have ten thousand): each
  // path's time is the sum of the sampled bytes over that class's rate.
  constexpr std::size_t kSampled = 16;
  const std::size_t step = std::max<std::size_t>(1, segments.size() / kSampled);
  double kernel_s = 0, dma_s = 0;
  for (std::size_t i = 0; i < segments.size(); i += step) {
    const LoadPathClass& c = nearest(classes, segments[i].bytes);
    // A forced path, or a class where one path is missing: as chosen.
    if (c.kernel_gbps <= 0 || c.dma_batch_gbps <= 0) return c.chosen;
    kernel_s += static_cast<double>(segments[i].bytes) / c.kernel_gbps;
    dma_s += static_cast<double>(segments[i].bytes) / c.dma_batch_gbps;
  }
  if (kernel_s <= 0 || dma_s <= 0) return LoadPath::kernel;
  return choose(1 / kernel_s, 1 / dma_s);
}

std::string LoadPaths::describe() const {
  std::string out = how + ":";
  for (const LoadPathClass& c : classes) {
    const std::uint64_t b = c.segment_bytes;
    const std::string size = b >= (1u << 20) && b % (1u << 20) == 0 ? std::to_string(b >> 20) + " MiB"
                             : b >= 1024 && b % 1024 == 0         ? std::to_string(b >> 10) + " KiB"
                                                                  : std::to_string(b) + " B";
    out += fmt::format(" {} {} (kernel {:.1f}, dma-batch {:.1f} GB/s);", size, to_string(c.chosen), c.kernel_gbps,
                       c.dma_batch_gbps);
  }
  out.pop_back();
  return out;
}

std::optional<LoadPathOption> parse_load_path(std::string_view option) noexcept {
  if (option == "rule") return LoadPathOption::rule;
  if (option == "measure") return LoadPathOption::measure;
  if (option == "kernel") return LoadPathOption::kernel;
  if (option == "dma-batch") return LoadPathOption::dma_batch;
  return std::nullopt;
}

namespace {

std::mutex g_mutex;
// Every table ever set, kept for the process's life: copy_batch on a
// strand may still be reading the one replaced (a few per process).
std::deque<std::unique_ptr<const LoadPaths>> g_kept;
std::atomic<const LoadPaths*> g_current{nullptr};
std::optional<LoadPaths> g_measured;  // under g_mutex: every size probed so far
bool g_forced = false;                // under g_mutex: the last Connector forced a path

void set_locked(std::optional<LoadPaths> paths) {
  if (!paths) {
    g_current.store(nullptr, std::memory_order_release);
    return;
  }
  g_kept.push_back(std::make_unique<const LoadPaths>(std::move(*paths)));
  g_current.store(g_kept.back().get(), std::memory_order_release);
}

LoadPaths forced(LoadPath p) {
  return {{{1, 0, 0, p}}, std::string("load_path=") + to_string(p)};
}

}  // namespace

const LoadPaths* load_paths() noexcept { return g_current.load(std::memory_order_acquire); }

void set_load_paths(std::optional<LoadPaths> paths) {
  std::lock_guard lk(g_mutex);
  set_locked(std::move(paths));
}

void forget_load_paths() {
  std::lock_guard lk(g_mutex);
  set_locked(std::nullopt);
  g_measured.reset();
  g_forced = false;
}

Status use_load_path(LoadPathOption option, int /*device*/) {
  std::lock_guard lk(g_mutex);
  g_forced = option != LoadPathOption::measure;
  if (!g_forced) {
    set_locked(g_measured);  // what registrations have had measured so far, if anything
    return {};
  }
  if (option == LoadPathOption::rule) {
    set_locked(std::nullopt);
    return {};
  }
  const LoadPath p = option == LoadPathOption::kernel ? LoadPath::kernel : LoadPath::dma_batch;
  if (!backend::batch_via_available(p == LoadPath::kernel ? backend::BatchVia::kernel : backend::BatchVia::dma_batch))
    return {Errc::not_supported, std::string("load_path=") + to_string(p),
            std::string("the ") + backend::name() + " backend has no " +
                (p == LoadPath::kernel ? "gather kernel" : "batched DMA call (CUDA 12.8 and a driver that takes it)")};
  set_locked(forced(p));
  return {};
}

Status measure_load_paths_for(std::vector<std::uint64_t> sizes, int device) {
  std::lock_guard lk(g_mutex);
  if (g_forced || !backend::load_paths_differ()) return {};
  // The first time, the general classes too (a batch of other sizes takes
  // the nearest); later, only sizes never measured.
  if (!g_measured) {
    const std::vector<std::uint64_t> general = LoadPathProbeOptions::default_segment_sizes();
    sizes.insert(sizes.end(), general.begin(), general.end());
  }
  std::sort(sizes.begin(), sizes.end());
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  if (g_measured)
    std::erase_if(sizes, [](std::uint64_t b) {
      return std::any_of(g_measured->classes.begin(), g_measured->classes.end(),
                         [b](const LoadPathClass& c) { return c.segment_bytes == b; });
    });
  std::erase(sizes, 0);
  if (sizes.empty()) return {};
  // On a thread of its own: the probe needs `device` current, and the
  // caller's thread (the engine's) keeps whatever device it had.
  std::optional<Result<LoadPaths>> got;
  std::thread([&] {
    if (Status s = backend::set_device(device); !s.ok()) {
      got.emplace(s);
      return;
    }
    LoadPathProbeOptions o;
    o.segment_bytes = sizes;
    got.emplace(measure_load_paths(o));
  }).join();
  if (!got->ok()) return got->status();
  LoadPaths more = std::move(*got).value();
  if (!g_measured) g_measured = LoadPaths{};
  g_measured->classes.insert(g_measured->classes.end(), more.classes.begin(), more.classes.end());
  std::sort(g_measured->classes.begin(), g_measured->classes.end(),
            [](const LoadPathClass& a, const LoadPathClass& b) { return a.segment_bytes < b.segment_bytes; });
  g_measured->how = "measured on device " + std::to_string(device) + " " + more.how;
  // Quiet by default (an engine's own log level shows it): /debug/load-path
  // and the metrics say it too.
  spdlog::debug("kvstrand: loads' path {}", g_measured->describe());
  set_locked(g_measured);
  return {};
}

}  // namespace kvstrand::device
