#include <cuda_runtime.h>

#include <algorithm>

#include "hip/segment_copy_kernel.hpp"

namespace kvstrand::hip::kernel {
namespace {

// One block copies one tile of one segment: 256 threads, each with four
// independent 16-byte loads issued before its four stores. Reads of pinned
// host memory cross PCIe with a microsecond of latency, so what keeps the
// link busy is the number of loads in flight, not the number of threads.
constexpr unsigned kThreads = 256;
constexpr unsigned kLoads = 4;
constexpr std::uint64_t kTileBytes = std::uint64_t{kThreads} * kLoads * 16;

// The segments travel in the launch's parameters, so no table has to be
// copied to the device (and waited for) before the launch. first_tile is
// each segment's first block; first_tile[count] is the grid. Two sizes: the
// small one keeps the parameter copy short for the common load (a block's
// planes), the large one (within CUDA 12.1's 32,764-byte parameter limit)
// keeps thousands of small segments (a paged layout's per-layer blocks) in a
// few launches.
template <int N>
struct Table {
  KernelSegment seg[N];
  std::uint32_t first_tile[N + 1];
  int count;
};
static_assert(sizeof(Table<1024>) <= 32'764, "CUDA's kernel parameter limit");

template <int N>
__global__ void __launch_bounds__(kThreads) copy_tiles(const __grid_constant__ Table<N> t) {
  // The block's segment: the last one whose first tile is at or before the
  // block (every thread reads the same entries: constant-cache broadcasts).
  int lo = 0, hi = t.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (t.first_tile[mid] <= blockIdx.x) lo = mid;
    else hi = mid - 1;
  }
  const KernelSegment g = t.seg[lo];
  const std::uint64_t begin = static_cast<std::uint64_t>(blockIdx.x - t.first_tile[lo]) * kTileBytes;
  const std::uint64_t end = g.bytes < begin + kTileBytes ? g.bytes : begin + kTileBytes;
  if (((g.src | g.dst | g.bytes) & 15) == 0) {
    const uint4* src = reinterpret_cast<const uint4*>(g.src);
    uint4* dst = reinterpret_cast<uint4*>(g.dst);
    const std::uint64_t first = begin / 16 + threadIdx.x, n = end / 16;
    uint4 r[kLoads];
#pragma unroll
    for (unsigned j = 0; j < kLoads; ++j)
      if (first + j * kThreads < n) r[j] = src[first + j * kThreads];
#pragma unroll
    for (unsigned j = 0; j < kLoads; ++j)
      if (first + j * kThreads < n) dst[first + j * kThreads] = r[j];
  } else {
    const unsigned char* src = reinterpret_cast<const unsigned char*>(g.src);
    unsigned char* dst = reinterpret_cast<unsigned char*>(g.dst);
    for (std::uint64_t i = begin + threadIdx.x; i < end; i += kThreads) dst[i] = src[i];
  }
}

template <int N>
int launch(const KernelSegment* segments, int count, cudaStream_t stream) {
  Table<N> t;
  std::uint64_t tiles = 0;
  for (int i = 0; i < count; ++i) {
    t.seg[i] = segments[i];
    t.first_tile[i] = static_cast<std::uint32_t>(tiles);
    tiles += (segments[i].bytes + kTileBytes - 1) / kTileBytes;
  }
  t.first_tile[count] = static_cast<std::uint32_t>(tiles);
  t.count = count;
  if (tiles == 0) return 0;
  copy_tiles<N><<<static_cast<unsigned>(tiles), kThreads, 0, stream>>>(t);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace

int segment_copy(const KernelSegment* segments, int count, void* stream) {
  constexpr int kSmall = 256, kLarge = 1024;
  // A grid's x dimension holds 2^31 - 1 blocks: a launch takes segments
  // until the next would pass 2^30 tiles (16 TiB), far beyond any load.
  constexpr std::uint64_t kMaxTiles = 1ull << 30;
  const auto s = static_cast<cudaStream_t>(stream);
  int first = 0;
  while (first < count) {
    int n = 0;
    std::uint64_t tiles = 0;
    while (first + n < count && n < kLarge) {
      const std::uint64_t more = (segments[first + n].bytes + kTileBytes - 1) / kTileBytes;
      if (n > 0 && tiles + more > kMaxTiles) break;
      tiles += more;
      ++n;
    }
    const int e = n <= kSmall ? launch<kSmall>(segments + first, n, s) : launch<kLarge>(segments + first, n, s);
    if (e != 0) return e;
    first += n;
  }
  return 0;
}

}  // namespace kvstrand::hip::kernel
