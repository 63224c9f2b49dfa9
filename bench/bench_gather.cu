// The scattered load's floor on a GPU: how fast can anything gather 141
// segments of pinned host memory into scattered device memory, against one
// contiguous copy of the same bytes, all timed by CUDA events on the device
// (no host path, no kvstrand). cuda builds only (bench/CMakeLists.txt).
//
// Rows: the shipped kernel (hip::kernel::segment_copy); kernel shapes with
// 4 or 8 independent 16-byte loads in flight per thread (streaming or plain
// loads, 128-512 threads, 2-16 blocks a segment), to see whether more
// memory-level parallelism per thread moves it; one DMA call a segment; one
// batched DMA call (cudaMemcpyBatchAsync, CUDA 12.8+); and a split of the
// segments between one batched DMA call and the kernel on two streams. The
// geometry is bench_transfer's load: 28 blocks x 5 planes of 147,968 B and
// a 1 MiB image, from a 256 MiB pinned arena into a 256 MiB device pool,
// both sides in a shuffled order. Each row: the median of 50 runs after 10
// warm-up runs. The last row checks the shipped kernel's bytes.
//
// usage: bench_gather
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "hip/segment_copy_kernel.hpp"

namespace {

using kvstrand::hip::kernel::KernelSegment;

constexpr int kMaxSegments = 160;
struct Table {
  KernelSegment seg[kMaxSegments];
};

// K independent 16-byte loads per thread before its K stores; a block
// copies tiles of blockDim * K moves and strides over its segment.
template <int K, bool kStreaming>
__global__ void gather_unrolled(Table t) {
  const KernelSegment g = t.seg[blockIdx.y];
  const uint4* src = reinterpret_cast<const uint4*>(g.src);
  uint4* dst = reinterpret_cast<uint4*>(g.dst);
  const std::uint64_t n = g.bytes / 16, tile = static_cast<std::uint64_t>(blockDim.x) * K;
  for (std::uint64_t base = blockIdx.x * tile; base < n; base += gridDim.x * tile) {
    uint4 r[K];
#pragma unroll
    for (int j = 0; j < K; ++j) {
      const std::uint64_t i = base + j * blockDim.x + threadIdx.x;
      if (i < n) r[j] = kStreaming ? __ldcs(src + i) : src[i];
    }
#pragma unroll
    for (int j = 0; j < K; ++j) {
      const std::uint64_t i = base + j * blockDim.x + threadIdx.x;
      if (i < n) dst[i] = r[j];
    }
  }
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "bench_gather: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main() {
  constexpr std::uint64_t kArena = 256ull << 20, kPlaneBlock = 147'968, kImage = 1ull << 20;
  constexpr int kSegments = 28 * 5 + 1;
  char* host = nullptr;
  char* dev = nullptr;
  if (!ok(cudaHostAlloc(&host, kArena, 0), "cudaHostAlloc") || !ok(cudaMalloc(&dev, kArena), "cudaMalloc")) return 1;
  std::memset(host, 0x5a, kArena);
  // Slots of the largest segment, shuffled on each side: every segment lands
  // apart from its neighbours, so nothing coalesces.
  std::vector<std::uint64_t> hslot, dslot;
  for (std::uint64_t at = 0; at + kImage <= kArena; at += kImage) hslot.push_back(at), dslot.push_back(at);
  std::mt19937 rng(1);
  std::shuffle(hslot.begin(), hslot.end(), rng);
  std::shuffle(dslot.begin(), dslot.end(), rng);
  std::vector<KernelSegment> segs;
  std::vector<void*> dsts, srcs;
  std::vector<std::size_t> sizes;
  std::uint64_t bytes = 0;
  for (int i = 0; i < kSegments; ++i) {
    const std::uint64_t n = i + 1 == kSegments ? kImage : kPlaneBlock;
    segs.push_back({reinterpret_cast<std::uint64_t>(host + hslot[i]), reinterpret_cast<std::uint64_t>(dev + dslot[i]), n});
    srcs.push_back(host + hslot[i]);
    dsts.push_back(dev + dslot[i]);
    sizes.push_back(n);
    bytes += n;
  }
  Table table{};
  std::copy(segs.begin(), segs.end(), table.seg);

  cudaStream_t s, side;
  cudaEvent_t begin, end, join;
  if (!ok(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream") ||
      !ok(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking), "stream") || !ok(cudaEventCreate(&begin), "event") ||
      !ok(cudaEventCreate(&end), "event") || !ok(cudaEventCreate(&join), "event"))
    return 1;
  auto median_us = [&](auto&& enqueue) {
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
  };
  const double contiguous = median_us([&] { cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, s); });
  std::printf("bench_gather: %d segments, %.1f MiB, pinned host to device; one contiguous copy %.1f us (%.1f GB/s)\n",
              kSegments, bytes / 1048576.0, contiguous, bytes / contiguous / 1e3);
  double best_kernel = 1e9;
  auto row = [&](const char* name, double us, bool kernel) {
    if (kernel) best_kernel = std::min(best_kernel, us);
    std::printf("  %-44s %7.1f us %5.1f GB/s  ratio %.3f\n", name, us, bytes / us / 1e3, us / contiguous);
  };
  const double shipped = median_us([&] { kvstrand::hip::kernel::segment_copy(segs.data(), kSegments, s); });
  row("shipped kernel (segment_copy)", shipped, true);
  char name[96];
  for (const unsigned threads : {128u, 256u, 512u})
    for (const unsigned x : {2u, 4u, 8u, 16u}) {
      const dim3 grid(x, kSegments);
      std::snprintf(name, sizeof name, "4 loads/thread, streaming, %u thr x %u blk", threads, x);
      row(name, median_us([&] { gather_unrolled<4, true><<<grid, threads, 0, s>>>(table); }), true);
      std::snprintf(name, sizeof name, "8 loads/thread, streaming, %u thr x %u blk", threads, x);
      row(name, median_us([&] { gather_unrolled<8, true><<<grid, threads, 0, s>>>(table); }), true);
      std::snprintf(name, sizeof name, "8 loads/thread, plain, %u thr x %u blk", threads, x);
      row(name, median_us([&] { gather_unrolled<8, false><<<grid, threads, 0, s>>>(table); }), true);
    }
  row("one cudaMemcpyAsync a segment", median_us([&] {
        for (int i = 0; i < kSegments; ++i) cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyHostToDevice, s);
      }),
      false);
#if CUDART_VERSION >= 12080
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  std::size_t attr_index = 0;
  row("one cudaMemcpyBatchAsync", median_us([&] {
        cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), kSegments, &attr, &attr_index, 1, s);
      }),
      false);
  for (const int by_dma : {kSegments / 4, kSegments / 2}) {
    std::snprintf(name, sizeof name, "split: %d segments by DMA batch, rest kernel", by_dma);
    row(name, median_us([&] {
          cudaEventRecord(join, s);
          cudaStreamWaitEvent(side, join, 0);
          cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), by_dma, &attr, &attr_index, 1, side);
          kvstrand::hip::kernel::segment_copy(segs.data() + by_dma, kSegments - by_dma, s);
          cudaEventRecord(join, side);
          cudaStreamWaitEvent(s, join, 0);
        }),
        false);
  }
#endif
  std::printf("best kernel shape %.3f of the contiguous copy; the shipped kernel %.3f\n", best_kernel / contiguous,
              shipped / contiguous);
  // The shipped kernel's bytes, once more from a zeroed pool.
  if (!ok(cudaMemset(dev, 0, kArena), "cudaMemset")) return 1;
  kvstrand::hip::kernel::segment_copy(segs.data(), kSegments, s);
  if (!ok(cudaStreamSynchronize(s), "copy")) return 1;
  std::vector<char> back(kImage);
  std::size_t wrong = 0;
  for (int i = 0; i < kSegments; ++i) {
    cudaMemcpy(back.data(), dsts[i], sizes[i], cudaMemcpyDeviceToHost);
    wrong += std::count_if(back.begin(), back.begin() + sizes[i], [](char c) { return c != 0x5a; });
  }
  std::printf("shipped kernel: %zu bytes copied wrong\n", wrong);
  return wrong == 0 ? 0 : 1;
}
