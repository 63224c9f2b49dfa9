#include <cuda_runtime.h>

#include <algorithm>

#include "hip/segment_copy_kernel.hpp"

namespace kvstrand::hip::kernel {
namespace {

// Passed by value: 160 segments keep the parameter block under the 4 KiB
// every CUDA version accepts, so no table has to be copied to the device
// (and waited for) before the launch.
constexpr int kPerLaunch = 160;
struct Table {
  KernelSegment seg[kPerLaunch];
};

// blockIdx.y picks the segment; the x blocks stride over it. 16-byte moves
// when both ends and the length allow (the KV planes always do), else bytes.
__global__ void copy_segments(Table t) {
  const KernelSegment g = t.seg[blockIdx.y];
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  std::uint64_t i = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (((g.src | g.dst | g.bytes) & 15) == 0) {
    const uint4* src = reinterpret_cast<const uint4*>(g.src);
    uint4* dst = reinterpret_cast<uint4*>(g.dst);
    for (const std::uint64_t n = g.bytes / 16; i < n; i += stride) dst[i] = src[i];
  } else {
    const unsigned char* src = reinterpret_cast<const unsigned char*>(g.src);
    unsigned char* dst = reinterpret_cast<unsigned char*>(g.dst);
    for (; i < g.bytes; i += stride) dst[i] = src[i];
  }
}

}  // namespace

int segment_copy(const KernelSegment* segments, int count, void* stream) {
  constexpr unsigned kThreads = 256;
  for (int first = 0; first < count; first += kPerLaunch) {
    const int n = std::min(kPerLaunch, count - first);
    Table t{};
    std::uint64_t largest = 0;
    for (int i = 0; i < n; ++i) {
      t.seg[i] = segments[first + i];
      largest = std::max(largest, t.seg[i].bytes);
    }
    // About four 16-byte moves a thread for the largest segment, at most 64 blocks a segment.
    const std::uint64_t per_block = kThreads * 16ull * 4;
    const unsigned x = static_cast<unsigned>(std::clamp<std::uint64_t>((largest + per_block - 1) / per_block, 1, 64));
    copy_segments<<<dim3(x, static_cast<unsigned>(n)), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(t);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return static_cast<int>(e);
  }
  return 0;
}

}  // namespace kvstrand::hip::kernel
