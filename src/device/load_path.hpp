// Which way a load's scattered segments go from pinned host memory to the
// device: the SMs' gather kernel or one batched DMA call (the copy
// engines gather), per segment-size class, chosen by timing both on the
// host it runs on (load_path_probe.hpp).
//
// Why measured and not a rule: which is faster depends on the host, not on
// the GPU model. On one H100 host the SMs read pinned host memory near the
// copy engines' rate and the kernel won below 1 MiB segments; on another
// they read it at 33 GB/s against the copy engines' 54, and the DMA batch
// loaded the reference geometry about 40 % faster (issue 66;
// docs/performance-history.md). A fixed rule loses on one of them.
//
// Loads (host to device) only. Saves keep one DMA batch: a kernel's reads
// of device memory contend across processes, which one process's probe
// cannot see (docs/performance-history.md, fifteenth run).
//
// The choice is process-wide, as copy_batch's path is: an engine process
// drives one device. copy_batch reads it lock-free on the strand; it is
// replaced only by a Connector's construction (use_load_path) and its
// registrations (measure_load_paths_for: the sizes those loads will have,
// probed exactly, since the copy engines' rate depends on a segment's size
// and alignment, not only its order of magnitude).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "device/copy.hpp"
#include "device/status.hpp"

namespace kvstrand::device {

enum class LoadPath { kernel, dma_batch };
const char* to_string(LoadPath p) noexcept;

// One segment size's probe: each path's rate (0: not available, or not
// measured because forced) and the path loads of that size take.
struct LoadPathClass {
  std::uint64_t segment_bytes = 0;
  double kernel_gbps = 0;
  double dma_batch_gbps = 0;
  LoadPath chosen = LoadPath::kernel;
};

struct LoadPaths {
  std::vector<LoadPathClass> classes;  // ascending segment_bytes
  std::string how;                     // "measured on device 0 in 0.21 s", "load_path=kernel"
  // The chosen path of the class nearest `segment_bytes` on a log scale (a
  // 148 KiB segment takes the 128 KiB class's).
  LoadPath path_for(std::uint64_t segment_bytes) const noexcept;
  // A load's path: each path's time for the batch estimated from the rates
  // of the classes of at most 16 of its segments, spread over it, and
  // choose() between them. A batch of one size takes its class's path; a
  // mixed one (a hybrid model's small K,V blocks and MiB-sized states) is
  // weighed by its bytes, where one mean size would stand for neither.
  LoadPath path_for(std::span<const Segment> segments) const noexcept;
  // One line: how, then each class's size, rates and choice.
  std::string describe() const;
};

// The copy engines are taken only when faster than the kernel by more than
// this: on an H100 the probe rated them within 2 % of the kernel for 128
// KiB segments where the reference load (141 segments of ~148 KiB) ran 6 %
// slower by them, and a hybrid's mixed batch 9 % slower, than by the kernel
// (docs/performance-history.md, twenty-ninth run). Where the SMs read host
// memory slowly the copy engines win by far more (40 %).
inline constexpr double kCopyEnginesMustWinBy = 0.03;
// The faster path, the kernel on a tie; a rate of 0 (unavailable) never wins.
LoadPath choose(double kernel_gbps, double dma_batch_gbps) noexcept;

// What ConnectorOptions::load_path may say: "rule" (the backend's
// built-in rule, nothing measured), "measure", "kernel", "dma-batch".
// Anything else: nullopt.
enum class LoadPathOption { rule, measure, kernel, dma_batch };
std::optional<LoadPathOption> parse_load_path(std::string_view option) noexcept;

// What copy_batch's loads follow now: nullptr until a Connector chose one
// (then the backend's built-in rule applies).
const LoadPaths* load_paths() noexcept;
// Replaces it (nullopt: back to the built-in rule). Never on the strand's
// hot path: a Connector's construction, a test, a benchmark.
void set_load_paths(std::optional<LoadPaths> paths);

// A Connector's construction: a forced path is set as it is, the rule
// clears any (then nothing is measured); measure sets what registrations
// have had measured so far, if anything. Errc::not_supported: a forced path this backend
// does not have.
Status use_load_path(LoadPathOption option, int device);
// A registration's segment sizes (each plane's block, each state slot),
// from register_layout: under measure, each size the process never
// measured is timed on `device` (the first time, the general classes of
// LoadPathProbeOptions too) and added to what loads follow. Blocks the
// calling thread (the engine's, registering) for the probe: a fraction of
// a second the first time, a few milliseconds a size later. A probe that
// cannot run (device memory taken, say) leaves what was there, and says
// why: loads still work, at the built-in rule's speed.
Status measure_load_paths_for(std::vector<std::uint64_t> segment_sizes, int device);
// Tests and benchmarks: forgets the measurement too, so that the next
// registration probes again.
void forget_load_paths();

}  // namespace kvstrand::device
