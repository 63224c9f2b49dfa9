// The scattered load's floor on a GPU: how fast can anything gather
// segments of pinned host memory into scattered device memory, against one
// contiguous copy of the same bytes, all timed by CUDA events on the device
// (no host path, no kvstrand). cuda builds only (bench/CMakeLists.txt).
//
// Geometries: bench_transfer's load (28 blocks x 5 planes of 147,968 B and
// a 1 MiB image); one segment size at a time from 4 KiB to 2 MiB (~20 MiB
// each); and the paged layouts engines have (vLLM: one segment per layer,
// K or V, and block). Each segment lands apart from its neighbours, in a
// shuffled order, on both sides, so nothing coalesces.
//
// Rows, each the median of 50 runs after 10 warm-up runs, as a ratio to
// the contiguous copy: the shipped kernel (device::kernel::segment_copy); where
// it stages a table in device memory (over 1,024 segments), the same tiles
// in launch parameters only, 1,024 a launch (what it did before); the
// kernel before that (one 2-D grid of at most 160 segments a launch, a
// stride loop of one load at a time); one batched DMA call
// (cudaMemcpyBatchAsync, CUDA 12.8+); and the shipped kernel copying one
// contiguous range of the same bytes, which is the floor for any gather by
// the SMs: what is left above it is the gather's own cost; the SMs and the
// copy engines at once (one contiguous range split between them, then the
// gather with the DMA batch taking the largest segments up to a quarter or
// a half of the bytes, the kernel the rest). Last, the shipped kernel's
// bytes, both ways, are checked for every geometry. First, kvstrand's own
// probe (device/load_path_probe.hpp) runs, and each geometry's line names the
// path kvstrand would take for it, beside every path's figure.
//
// usage: bench_gather [--probe-rounds R] [--probe-copies C]
//   the probe's rounds and copies a round (device/load_path_probe.hpp), where
//   not its defaults: to compare how the probe times against these rows.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "device/segment_copy_kernel.hpp"
#include "device/segment_grid.hpp"

namespace {

using kvstrand::device::kernel::KernelSegment;

// kvstrand's own choice of load path on this host (bench/load_path_choice.cpp).
extern "C" const char* kvstrand_bench_measure_load_paths(int rounds, int copies_per_round);
extern "C" const char* kvstrand_bench_load_path_for(const std::uint64_t* sizes, std::size_t count);

// The kernel shipped before the flat-tile one (docs/performance-history.md, twenty-second run), kept as this bench's "before" row.
constexpr int kBeforePerLaunch = 160;
struct BeforeTable {
  KernelSegment seg[kBeforePerLaunch];
};

__global__ void before_copy_segments(BeforeTable t) {
  const KernelSegment g = t.seg[blockIdx.y];
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const uint4* src = reinterpret_cast<const uint4*>(g.src);
  uint4* dst = reinterpret_cast<uint4*>(g.dst);
  for (const std::uint64_t n = g.bytes / 16; i < n; i += stride) dst[i] = src[i];
}

void before_segment_copy(const KernelSegment* segments, int count, cudaStream_t s) {
  for (int first = 0; first < count; first += kBeforePerLaunch) {
    const int n = std::min(kBeforePerLaunch, count - first);
    BeforeTable t{};
    std::uint64_t largest = 0;
    for (int i = 0; i < n; ++i) {
      t.seg[i] = segments[first + i];
      largest = std::max(largest, t.seg[i].bytes);
    }
    const std::uint64_t per_block = 256 * 16ull * 4;
    const unsigned x = static_cast<unsigned>(std::clamp<std::uint64_t>((largest + per_block - 1) / per_block, 1, 64));
    before_copy_segments<<<dim3(x, static_cast<unsigned>(n)), 256, 0, s>>>(t);
  }
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "bench_gather: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

constexpr std::uint64_t kArena = 256ull << 20;

struct Bench {
  char* host = nullptr;
  char* dev = nullptr;
  cudaStream_t s{}, s2{};  // s2: the copy engines' half of the rows that use both at once
  cudaEvent_t begin{}, end{}, fork{}, join{};
  std::mt19937 rng{1};
  int failures = 0;

  template <class F>
  double median_us(F&& enqueue) {
    std::vector<float> ms;
    for (int run = 0; run < 60; ++run) {
      cudaEventRecord(begin, s);
      enqueue();
      cudaEventRecord(end, s);
      cudaEventSynchronize(end);
      float m = 0;
      cudaEventElapsedTime(&m, begin, end);
      if (run >= 10) ms.push_back(m);
    }
    std::sort(ms.begin(), ms.end());
    return 1e3 * ms[ms.size() / 2];
  }

  // Lays the segments out in a shuffled order with a 4 KiB gap after each,
  // independently on each side.
  std::vector<std::uint64_t> scatter(const std::vector<std::uint64_t>& sizes) {
    std::vector<std::size_t> order(sizes.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<std::uint64_t> at(sizes.size());
    std::uint64_t next = 0;
    for (std::size_t i : order) {
      at[i] = next;
      next += (sizes[i] + 4096 + 4095) & ~std::uint64_t{4095};
    }
    return at;
  }

  void geometry(const std::string& name, const std::vector<std::uint64_t>& sizes, bool per_segment_dma = false) {
    geometry_at(name, sizes, scatter(sizes), scatter(sizes), per_segment_dma);
  }

  // A paged layout's load as kvstrand plans it (tier/object_format.hpp),
  // plane by plane: on the device, plane p's tensor of `pool` blocks, the
  // load's blocks at distinct random ids in it; on the host, chunk objects
  // of 16 blocks at shuffled places, plane p's blocks at its offset in each.
  // A grid (device/segment_grid.hpp), which the shipped kernel sends as one.
  void paged(const std::string& name, std::size_t planes, std::size_t blocks, std::uint64_t block_bytes,
             std::size_t pool) {
    std::vector<std::uint64_t> ids(pool);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    const auto objects = scatter(std::vector<std::uint64_t>((blocks + 15) / 16, planes * 16 * block_bytes));
    std::vector<std::uint64_t> sizes, hat, dat;
    for (std::size_t p = 0; p < planes; ++p)
      for (std::size_t b = 0; b < blocks; ++b) {
        sizes.push_back(block_bytes);
        hat.push_back(objects[b / 16] + (p * 16 + b % 16) * block_bytes);
        dat.push_back(p * (pool * block_bytes + 4096) + ids[b] * block_bytes);
      }
    geometry_at(name, sizes, hat, dat);
    // Where the rest above the SMs' floor goes: the same segments with one
    // side laid out contiguously (each still a grid, through the shipped
    // kernel), and both.
    std::vector<std::uint64_t> in_order(sizes.size());
    for (std::size_t i = 1; i < sizes.size(); ++i) in_order[i] = in_order[i - 1] + sizes[i - 1];
    const std::uint64_t bytes = std::accumulate(sizes.begin(), sizes.end(), std::uint64_t{0});
    const double contiguous = median_us([&] { cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s); });
    auto as_planned_but = [&](const char* what, const std::vector<std::uint64_t>& h, const std::vector<std::uint64_t>& d) {
      std::vector<KernelSegment> segs;
      for (std::size_t i = 0; i < sizes.size(); ++i)
        segs.push_back({reinterpret_cast<std::uint64_t>(host + h[i]), reinterpret_cast<std::uint64_t>(dev + d[i]), sizes[i]});
      const double us = median_us([&] { kvstrand::device::kernel::segment_copy(segs.data(), static_cast<int>(segs.size()), s); });
      std::printf("  %-46s %8.1f us %5.1f GB/s  ratio %.3f\n", what, us, bytes / us / 1e3, us / contiguous);
    };
    as_planned_but("host side in order (device as planned)", in_order, dat);
    as_planned_but("device side in order (host as planned)", hat, in_order);
    as_planned_but("both sides in order, the same segments", in_order, in_order);
  }

  void geometry_at(const std::string& name, const std::vector<std::uint64_t>& sizes, const std::vector<std::uint64_t>& hat,
                   const std::vector<std::uint64_t>& dat, bool per_segment_dma = false) {
    const std::uint64_t bytes = std::accumulate(sizes.begin(), sizes.end(), std::uint64_t{0});
    for (std::size_t i = 0; i < sizes.size(); ++i)
      if (hat[i] + sizes[i] > kArena || dat[i] + sizes[i] > kArena) {
        std::fprintf(stderr, "bench_gather: %s does not fit the 256 MiB arena\n", name.c_str());
        ++failures;
        return;
      }
    std::vector<KernelSegment> segs;
    std::vector<void*> dsts, srcs;
    std::vector<std::size_t> lens(sizes.begin(), sizes.end());
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      segs.push_back({reinterpret_cast<std::uint64_t>(host + hat[i]), reinterpret_cast<std::uint64_t>(dev + dat[i]),
                      sizes[i]});
      srcs.push_back(host + hat[i]);
      dsts.push_back(dev + dat[i]);
    }
    const int n = static_cast<int>(segs.size());
    const double contiguous = median_us([&] { cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s); });
    std::printf("%s: %d segments, %.1f MiB; one contiguous copy %.1f us (%.1f GB/s); kvstrand's measured path: %s\n",
                name.c_str(), n, bytes / 1048576.0, contiguous, bytes / contiguous / 1e3,
                kvstrand_bench_load_path_for(sizes.data(), sizes.size()));
    auto row = [&](const char* what, double us) {
      std::printf("  %-46s %8.1f us %5.1f GB/s  ratio %.3f\n", what, us, bytes / us / 1e3, us / contiguous);
    };
    const KernelSegment whole{reinterpret_cast<std::uint64_t>(host), reinterpret_cast<std::uint64_t>(dev), bytes};
    row("kernel, one contiguous range (the SMs' floor)",
        median_us([&] { kvstrand::device::kernel::segment_copy(&whole, 1, s); }));
    row("shipped kernel (segment_copy)", median_us([&] { kvstrand::device::kernel::segment_copy(segs.data(), n, s); }));
    const bool grid = n > 256 && kvstrand::device::find_grid(segs.data(), segs.size(), 384, 768).has_value();
    if (grid)  // where the shipped kernel sends a grid: the same segments as listed
      row("as listed (no grid)", median_us([&] { kvstrand::device::kernel::segment_copy_listed(segs.data(), n, s); }));
    if (n > 1024)  // where the shipped kernel stages a table in device memory: the launches it replaced
      row("in launch parameters only, 1,024 a launch",
          median_us([&] { kvstrand::device::kernel::segment_copy_in_parameters(segs.data(), n, s); }));
    row("the kernel before (2-D grid, stride loop)", median_us([&] { before_segment_copy(segs.data(), n, s); }));
#if CUDART_VERSION >= 12080
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    std::size_t attr_index = 0;
    row("one cudaMemcpyBatchAsync", median_us([&] {
          cudaMemcpyBatchAsync(dsts.data(), srcs.data(), lens.data(), n, &attr, &attr_index, 1, s);
        }));
#endif
    // The SMs and the copy engines at once, each on its own stream. First
    // the floor of that: one contiguous range, half by the kernel and half
    // by one copy (whether the two together read host memory faster than
    // either alone). Then a gather shared the same way: the DMA batch takes
    // the largest segments up to a share of the bytes, the kernel the rest.
    auto at_once = [&](auto&& kernel_part, auto&& dma_part) {
      return median_us([&] {
        cudaEventRecord(fork, s);
        cudaStreamWaitEvent(s2, fork, 0);
        dma_part();
        kernel_part();
        cudaEventRecord(join, s2);
        cudaStreamWaitEvent(s, join, 0);
      });
    };
    {
      const std::uint64_t half = (bytes / 2) & ~std::uint64_t{4095};
      const KernelSegment first{reinterpret_cast<std::uint64_t>(host), reinterpret_cast<std::uint64_t>(dev), half};
      row("one range, half by kernel, half by copy, at once", at_once([&] { kvstrand::device::kernel::segment_copy(&first, 1, s); },
                                                                     [&] {
                                                                       cudaMemcpyAsync(dev + half, host + half, bytes - half,
                                                                                       cudaMemcpyHostToDevice, s2);
                                                                     }));
    }
#if CUDART_VERSION >= 12080
    for (const int share : {25, 50}) {
      std::vector<std::size_t> by_size(sizes.size());
      std::iota(by_size.begin(), by_size.end(), 0);
      std::stable_sort(by_size.begin(), by_size.end(), [&](std::size_t x, std::size_t y) { return sizes[x] > sizes[y]; });
      std::vector<KernelSegment> rest;
      std::vector<void*> dma_dst, dma_src;
      std::vector<std::size_t> dma_len;
      std::uint64_t dma_bytes = 0;
      for (std::size_t i : by_size) {
        if ((dma_bytes + sizes[i]) * 100 <= bytes * share) {
          dma_bytes += sizes[i];
          dma_dst.push_back(dsts[i]), dma_src.push_back(srcs[i]), dma_len.push_back(lens[i]);
        } else {
          rest.push_back(segs[i]);
        }
      }
      if (dma_len.empty() || rest.empty()) continue;
      const std::string what = "kernel + DMA batch at once, DMA " + std::to_string(dma_bytes * 100 / bytes) + " %";
      row(what.c_str(), at_once([&] { kvstrand::device::kernel::segment_copy(rest.data(), static_cast<int>(rest.size()), s); },
                                [&] {
                                  cudaMemcpyBatchAsync(dma_dst.data(), dma_src.data(), dma_len.data(), dma_len.size(),
                                                       &attr, &attr_index, 1, s2);
                                }));
    }
#endif
    if (per_segment_dma)
      row("one cudaMemcpyAsync a segment", median_us([&] {
            for (int i = 0; i < n; ++i) cudaMemcpyAsync(dsts[i], srcs[i], lens[i], cudaMemcpyHostToDevice, s);
          }));
    // Each kernel's bytes, from a zeroed pool.
    auto wrong_after = [&](auto&& enqueue) -> std::size_t {
      if (!ok(cudaMemsetAsync(dev, 0, kArena, s), "cudaMemset")) return ++failures, 1;
      enqueue();
      if (!ok(cudaStreamSynchronize(s), "copy")) return ++failures, 1;
      std::size_t wrong = 0;
      std::vector<unsigned char> back;
      for (int i = 0; i < n; ++i) {
        back.resize(lens[i]);
        cudaMemcpy(back.data(), dsts[i], lens[i], cudaMemcpyDeviceToHost);
        for (std::size_t k = 0; k < lens[i]; ++k) wrong += back[k] != static_cast<unsigned char>(hat[i] + k);
      }
      return wrong;
    };
    const std::size_t wrong = wrong_after([&] { kvstrand::device::kernel::segment_copy(segs.data(), n, s); });
    const std::size_t wrong_params = wrong_after([&] { kvstrand::device::kernel::segment_copy_in_parameters(segs.data(), n, s); });
    const std::size_t wrong_listed =
        grid ? wrong_after([&] { kvstrand::device::kernel::segment_copy_listed(segs.data(), n, s); }) : 0;
    std::printf("  shipped kernel (%s): %zu bytes copied wrong; in parameters only: %zu%s\n", grid ? "a grid" : "as listed",
                wrong, wrong_params, grid ? (", as listed: " + std::to_string(wrong_listed)).c_str() : "");
    if (wrong + wrong_params + wrong_listed != 0) ++failures;
  }
};

std::vector<std::uint64_t> repeat(std::uint64_t size, std::size_t count) { return std::vector<std::uint64_t>(count, size); }

}  // namespace

int main(int argc, char** argv) {
  int probe_rounds = 0, probe_copies = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--probe-rounds" || a == "--probe-copies") && i + 1 < argc) {
      (a == "--probe-rounds" ? probe_rounds : probe_copies) = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_gather [--probe-rounds R] [--probe-copies C]\n");
      return 2;
    }
  }
  Bench b;
  if (!ok(cudaHostAlloc(&b.host, kArena, 0), "cudaHostAlloc") || !ok(cudaMalloc(&b.dev, kArena), "cudaMalloc")) return 1;
  // Each byte is its own offset's low byte, so a misplaced copy shows.
  for (std::uint64_t i = 0; i < kArena; ++i) b.host[i] = static_cast<char>(i);
  if (!ok(cudaStreamCreateWithFlags(&b.s, cudaStreamNonBlocking), "stream") ||
      !ok(cudaStreamCreateWithFlags(&b.s2, cudaStreamNonBlocking), "stream") || !ok(cudaEventCreate(&b.begin), "event") ||
      !ok(cudaEventCreate(&b.end), "event") || !ok(cudaEventCreateWithFlags(&b.fork, cudaEventDisableTiming), "event") ||
      !ok(cudaEventCreateWithFlags(&b.join, cudaEventDisableTiming), "event"))
    return 1;

  // What kvstrand measures at a Connector's start (load_path=measure),
  // before any row: each geometry's line names the path it would take.
  std::printf("kvstrand's load paths %s\n", kvstrand_bench_measure_load_paths(probe_rounds, probe_copies));
  std::vector<std::uint64_t> reference = repeat(147'968, 28 * 5);
  reference.push_back(1ull << 20);
  b.geometry("reference load (bench_transfer's)", reference, true);
  for (const std::uint64_t kib : {4, 16, 64, 256, 1024, 2048})
    b.geometry(std::to_string(kib) + " KiB segments", repeat(kib << 10, (20ull << 20) / (kib << 10)));
  // vLLM's paged KV cache: one segment per layer, K or V, and block of 16
  // tokens; head_dim 128, bf16.
  b.geometry("vLLM Llama-3-8B, 32 blocks (32 layers x K,V x 8 heads: 32 KiB)", repeat(32 << 10, 32 * 32 * 2));
  b.geometry("vLLM Llama-3-70B TP8 rank, 64 blocks (80 layers x K,V x 1 head: 4 KiB)", repeat(4 << 10, 64 * 80 * 2));
  // The same two as kvstrand plans their loads (planes x blocks: a grid).
  b.paged("vLLM Llama-3-8B, 32 blocks, as planned (64 planes x 32 blocks of 32 KiB)", 64, 32, 32 << 10, 96);
  b.paged("vLLM Llama-3-8B, one 256-token chunk, as planned (64 planes x 16 blocks of 32 KiB)", 64, 16, 32 << 10, 96);
  b.paged("vLLM Llama-3-70B TP8 rank, 64 blocks, as planned (160 planes x 64 blocks of 4 KiB)", 160, 64, 4 << 10, 384);
  // A hybrid model's resume (an approximation of Jamba-like shapes, not any
  // one model's): 4 attention layers' K,V for 32 blocks, and 28 recurrent
  // layers' state, a 96 KiB conv state and a 2 MiB SSM state each.
  std::vector<std::uint64_t> hybrid = repeat(32 << 10, 32 * 4 * 2);
  for (int layer = 0; layer < 28; ++layer) hybrid.push_back(96 << 10), hybrid.push_back(2 << 20);
  b.geometry("hybrid (approximation): attention K,V + recurrent state", hybrid);
  return b.failures == 0 ? 0 : 1;
}
