#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstring>
#include <vector>

#include "device/segment_copy_kernel.hpp"
#include "device/segment_grid.hpp"

namespace kvstrand::device::kernel {
namespace {

// One block copies one tile of one segment: 256 threads, each with four
// independent 16-byte loads issued before its four stores. Reads of pinned
// host memory cross PCIe with a microsecond of latency, so what keeps the
// link busy is the number of loads in flight, not the number of threads.
constexpr unsigned kThreads = 256;
constexpr unsigned kLoads = 4;
constexpr std::uint64_t kTileBytes = std::uint64_t{kThreads} * kLoads * 16;
// A grid's x dimension holds 2^31 - 1 blocks: a launch takes segments until
// the next would pass 2^30 tiles (16 TiB), far beyond any load.
constexpr std::uint64_t kMaxTiles = 1ull << 30;

// The segments travel in the launch's parameters, so no table has to be
// copied to the device (and waited for) before the launch. first_tile is
// each segment's first block; first_tile[count] is the grid. Three sizes:
// the launch copies the whole struct, so the smaller ones keep that copy
// short for the common loads (a few chunks' planes; 160 took the launch
// call 3-6 us below 256 for the reference load, docs/PERFORMANCE.md), the
// large one (within CUDA 12.1's 32,764-byte parameter limit) keeps 1,024
// segments in a launch.
template <int N>
struct Table {
  KernelSegment seg[N];
  std::uint32_t first_tile[N + 1];
  int count;
};
static_assert(sizeof(Table<1024>) <= 32'764, "CUDA's kernel parameter limit");
constexpr int kSmallest = 160, kSmall = 256, kLarge = 1024;

// The block's segment: the last one whose first tile is at or before the
// block (every thread reads the same entries: broadcasts).
template <class FirstTiles>
__device__ int segment_of_block(const FirstTiles& first_tile, int count) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first_tile[mid] <= blockIdx.x) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

__device__ void copy_tile(const KernelSegment& g, std::uint64_t tile) {
  const std::uint64_t begin = tile * kTileBytes;
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
__global__ void __launch_bounds__(kThreads) copy_tiles(const __grid_constant__ Table<N> t) {
  const int i = segment_of_block(t.first_tile, t.count);
  copy_tile(t.seg[i], blockIdx.x - t.first_tile[i]);
}

// The same tiles over a table in device memory: one launch for any count.
__global__ void __launch_bounds__(kThreads)
    copy_tiles_from_table(const KernelSegment* seg, const std::uint32_t* first_tile, int count) {
  const int i = segment_of_block(first_tile, count);
  copy_tile(seg[i], blockIdx.x - first_tile[i]);
}

// A warp a segment, for tables of small segments only: each lane keeps
// eight 16-byte loads in flight, so a 4 KiB segment is one warp's single
// round, where a tile would give it a whole block of one load a thread.
constexpr unsigned kWarpLoads = 8;
constexpr std::uint64_t kWarpLargest = 64 << 10;

// One warp copies segment g: each lane keeps kWarpLoads 16-byte loads in
// flight.
__device__ void warp_copy(const KernelSegment& g, unsigned lane) {
  if (((g.src | g.dst | g.bytes) & 15) == 0) {
    const uint4* src = reinterpret_cast<const uint4*>(g.src);
    uint4* dst = reinterpret_cast<uint4*>(g.dst);
    const std::uint64_t n = g.bytes / 16;
    for (std::uint64_t base = 0; base < n; base += 32 * kWarpLoads) {
      uint4 r[kWarpLoads];
#pragma unroll
      for (unsigned j = 0; j < kWarpLoads; ++j)
        if (base + j * 32 + lane < n) r[j] = src[base + j * 32 + lane];
#pragma unroll
      for (unsigned j = 0; j < kWarpLoads; ++j)
        if (base + j * 32 + lane < n) dst[base + j * 32 + lane] = r[j];
    }
  } else {
    const unsigned char* src = reinterpret_cast<const unsigned char*>(g.src);
    unsigned char* dst = reinterpret_cast<unsigned char*>(g.dst);
    for (std::uint64_t i = lane; i < g.bytes; i += 32) dst[i] = src[i];
  }
}

__global__ void __launch_bounds__(kThreads) copy_warp_per_segment(const KernelSegment* seg, int count) {
  const std::uint64_t w = static_cast<std::uint64_t>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32;
  if (w >= static_cast<std::uint64_t>(count)) return;
  warp_copy(seg[w], threadIdx.x % 32);
}

// A grid of segments (device/segment_grid.hpp) in the launch's parameters:
// rows + columns entries stand for rows x columns segments, so a paged
// layout's thousands of small segments need no table in device memory.
// Two sizes, as Table's: a small one for short launches' parameter copy, a
// large one within CUDA 12.1's 32,764-byte limit.
template <int Rows, int Cols>
struct GridTable {
  std::uint64_t row_src[Rows];
  std::uint64_t row_dst[Rows];
  KernelSegment col[Cols];
  std::uint32_t rows, cols;
};
static_assert(sizeof(GridTable<384, 768>) <= 32'764, "CUDA's kernel parameter limit");

// A warp a segment, segment w being row w / cols, column w % cols: the
// warps of one block copy neighbouring columns of one row.
template <int Rows, int Cols>
__global__ void __launch_bounds__(kThreads) copy_grid(const __grid_constant__ GridTable<Rows, Cols> t) {
  const std::uint32_t w = blockIdx.x * (kThreads / 32) + threadIdx.x / 32;
  if (w >= t.rows * t.cols) return;
  const std::uint32_t r = w / t.cols, c = w % t.cols;
  const KernelSegment& col = t.col[c];
  warp_copy(KernelSegment{col.src + t.row_src[r], col.dst + t.row_dst[r], col.bytes}, threadIdx.x % 32);
}

template <int Rows, int Cols>
int launch_grid(const SegmentGrid& g, cudaStream_t stream) {
  GridTable<Rows, Cols> t;
  t.rows = static_cast<std::uint32_t>(g.rows());
  t.cols = static_cast<std::uint32_t>(g.columns.size());
  std::copy(g.row_src.begin(), g.row_src.end(), t.row_src);
  std::copy(g.row_dst.begin(), g.row_dst.end(), t.row_dst);
  std::copy(g.columns.begin(), g.columns.end(), t.col);
  const std::uint32_t warps = t.rows * t.cols;
  copy_grid<Rows, Cols><<<(warps + kThreads / 32 - 1) / (kThreads / 32), kThreads, 0, stream>>>(t);
  return static_cast<int>(cudaGetLastError());
}

// Sends a grid of small segments as one launch; false (nothing queued)
// where the segments are no grid that fits, or one is too large for a warp.
bool copy_as_grid(const KernelSegment* segments, int count, cudaStream_t s, int& error) {
  if (!std::all_of(segments, segments + count, [](const KernelSegment& g) { return g.bytes <= kWarpLargest; }))
    return false;
  const auto grid = find_grid(segments, static_cast<std::size_t>(count), 384, 768);
  if (!grid) return false;
  error = grid->rows() <= 128 && grid->columns.size() <= 128 ? launch_grid<128, 128>(*grid, s)
                                                               : launch_grid<384, 768>(*grid, s);
  return true;
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

#if CUDART_VERSION >= 12080
// The tables live in one memory pool a device, kept for the process's life
// (tables are freed in stream order at each load's end and allocated again
// at the next; a pool that kept nothing would give its memory back at every
// synchronize and map it again for the next load).
constexpr int kMaxDevices = 64;
constexpr std::uint64_t kPoolKeeps = 64ull << 20;
std::array<std::atomic<cudaMemPool_t>, kMaxDevices> g_pools{};
// Set once a driver refuses the staging (no pools): from then on every
// launch takes parameters.
std::atomic<bool> g_table_refused{false};

cudaMemPool_t table_pool(int device) {
  if (device < 0 || device >= kMaxDevices) return nullptr;
  if (cudaMemPool_t p = g_pools[device].load(std::memory_order_acquire)) return p;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device;
  cudaMemPool_t created = nullptr;
  if (cudaMemPoolCreate(&created, &props) != cudaSuccess) return nullptr;
  std::uint64_t keep = kPoolKeeps;
  (void)cudaMemPoolSetAttribute(created, cudaMemPoolAttrReleaseThreshold, &keep);
  // Two threads may race to create a device's pool (two reactors in one
  // process): the loser gives its pool back.
  cudaMemPool_t expected = nullptr;
  if (g_pools[device].compare_exchange_strong(expected, created, std::memory_order_acq_rel)) return created;
  (void)cudaMemPoolDestroy(created);
  return expected;
}

// The pinned slots tables are written into and copied to the device from,
// in stream order. The table was once copied out of ordinary memory by the
// driver "during the call" (cudaMemcpyBatchAsync, source access order
// during the API call): on an H100 (driver 580.159.04) loads of 4,096 4 KiB
// segments queued back to back then read tables with entries zeroed, the
// next call's table being built where the last one's had been, and the
// device lost its context to an illegal address (docs/performance-history.md,
// twenty-ninth run). A slot is claimed by one thread at a time (several
// reactors may share a process) and written only once the event recorded
// behind the last copy out of it has completed. Made at first use, kept
// for the process's life.
struct PinnedSlot {
  std::atomic<bool> claimed{false};
  std::byte* host = nullptr;
  cudaEvent_t copied = nullptr;
  int device = -1;  // the event's device
};
constexpr std::size_t kPinnedSlotBytes = 1 << 20;  // 43,690 small segments' entries
std::array<PinnedSlot, 8> g_slots;

// A slot whose last copy has ended, claimed; null when none is (then the
// launches take parameters). Events belong to the device current when they
// are made: only a thread whose current device is the stream's uses slots.
PinnedSlot* claim_slot(int device, std::size_t bytes) {
  int current = -1;
  if (bytes > kPinnedSlotBytes || cudaGetDevice(&current) != cudaSuccess || current != device) {
    (void)cudaGetLastError();
    return nullptr;
  }
  for (PinnedSlot& slot : g_slots) {
    if (slot.claimed.exchange(true, std::memory_order_acquire)) continue;
    if (slot.host == nullptr) {
      void* p = nullptr;
      if (cudaHostAlloc(&p, kPinnedSlotBytes, cudaHostAllocPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        slot.claimed.store(false, std::memory_order_release);
        return nullptr;
      }
      if (cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming) != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cudaFreeHost(p);
        slot.claimed.store(false, std::memory_order_release);
        return nullptr;
      }
      slot.host = static_cast<std::byte*>(p);
      slot.device = device;
    }
    if (slot.device == device && cudaEventQuery(slot.copied) == cudaSuccess) return &slot;
    (void)cudaGetLastError();  // cudaErrorNotReady: its copy is still queued
    slot.claimed.store(false, std::memory_order_release);
  }
  return nullptr;
}

// One launch over a table staged in stream-ordered device memory: the
// table is written into a pinned slot, copied from it in stream order, the
// kernel reads it, and the table is freed behind the kernel in stream
// order. Sets `staged` false, with nothing queued, where the table could not
// be staged (no pool, no free slot); the caller then launches with
// parameters.
int copy_from_device_table(const KernelSegment* segments, int count, cudaStream_t s, bool& staged) {
  staged = false;
  const bool small = std::all_of(segments, segments + count, [](const KernelSegment& g) { return g.bytes <= kWarpLargest; });
  std::vector<std::uint32_t> first_tile;
  if (!small) {
    first_tile.resize(static_cast<std::size_t>(count) + 1);
    std::uint64_t tiles = 0;
    for (int i = 0; i < count; ++i) {
      first_tile[i] = static_cast<std::uint32_t>(tiles);
      tiles += (segments[i].bytes + kTileBytes - 1) / kTileBytes;
      if (tiles > kMaxTiles) return 0;
    }
    first_tile[count] = static_cast<std::uint32_t>(tiles);
    if (tiles == 0) return 0;
  }
  int device = 0;
  cudaMemPool_t pool = nullptr;
  if (cudaStreamGetDevice(s, &device) != cudaSuccess || (pool = table_pool(device)) == nullptr) {
    (void)cudaGetLastError();
    g_table_refused.store(true, std::memory_order_relaxed);
    return 0;
  }
  const std::size_t seg_bytes = static_cast<std::size_t>(count) * sizeof(KernelSegment);
  const std::size_t tiles_at = (seg_bytes + 15) & ~std::size_t{15};
  const std::size_t table_bytes = tiles_at + first_tile.size() * sizeof(std::uint32_t);
  PinnedSlot* slot = claim_slot(device, table_bytes);
  if (slot == nullptr) return 0;
  struct Unclaim {
    PinnedSlot* slot;
    ~Unclaim() { slot->claimed.store(false, std::memory_order_release); }
  } unclaim{slot};
  void* table = nullptr;
  if (cudaMallocFromPoolAsync(&table, table_bytes, pool, s) != cudaSuccess) {
    (void)cudaGetLastError();  // out of device memory now: parameters, this time
    return 0;
  }
  std::memcpy(slot->host, segments, seg_bytes);
  if (!first_tile.empty()) std::memcpy(slot->host + tiles_at, first_tile.data(), first_tile.size() * sizeof(std::uint32_t));
  cudaError_t e = cudaMemcpyAsync(table, slot->host, table_bytes, cudaMemcpyHostToDevice, s);
  // Recorded whatever happened: a copy that was not queued reads nothing,
  // and the slot is written again only once this event completes.
  const cudaError_t recorded = cudaEventRecord(slot->copied, s);
  if (e == cudaSuccess) e = recorded;
  if (e == cudaSuccess) {
    auto* dev_segs = static_cast<KernelSegment*>(table);
    auto* dev_first = reinterpret_cast<std::uint32_t*>(static_cast<char*>(table) + tiles_at);
    if (small)
      copy_warp_per_segment<<<static_cast<unsigned>((static_cast<std::uint64_t>(count) + 7) / 8), kThreads, 0, s>>>(
          dev_segs, count);
    else
      copy_tiles_from_table<<<first_tile[count], kThreads, 0, s>>>(dev_segs, dev_first, count);
    e = cudaGetLastError();
  }
  staged = true;
  const cudaError_t freed = cudaFreeAsync(table, s);
  return static_cast<int>(e != cudaSuccess ? e : freed);
}
#endif

}  // namespace

int segment_copy_in_parameters(const KernelSegment* segments, int count, void* stream) {
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
    const int e = n <= kSmallest ? launch<kSmallest>(segments + first, n, s)
                  : n <= kSmall  ? launch<kSmall>(segments + first, n, s)
                                 : launch<kLarge>(segments + first, n, s);
    if (e != 0) return e;
    first += n;
  }
  return 0;
}

int segment_copy_listed(const KernelSegment* segments, int count, void* stream) {
#if CUDART_VERSION >= 12080
  // Past one launch's parameters, the tail of each launch's last wave and
  // the next launch's start cost more than staging a table once
  // (bench_gather: 10,240 segments of 4 KiB).
  if (count > kLarge && !g_table_refused.load(std::memory_order_relaxed)) {
    bool staged = false;
    const int e = copy_from_device_table(segments, count, static_cast<cudaStream_t>(stream), staged);
    if (staged) return e;
  }
#endif
  return segment_copy_in_parameters(segments, count, stream);
}

int segment_copy(const KernelSegment* segments, int count, void* stream) {
  // Past one small launch's parameters, a paged layout's segments are
  // usually a grid (planes x blocks): one launch with rows + columns in its
  // parameters, where the list would need a table or several launches.
  if (count > kSmall) {
    int e = 0;
    if (copy_as_grid(segments, count, static_cast<cudaStream_t>(stream), e)) return e;
  }
  return segment_copy_listed(segments, count, stream);
}

}  // namespace kvstrand::device::kernel
