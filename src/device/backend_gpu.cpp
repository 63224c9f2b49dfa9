// The hip and cuda backends: one file written against the HIP runtime names.
//
// KVSTRAND_GPU_HIP compiles it against Debian's HIP headers (AMD platform) and
// links libamdhip64; KVSTRAND_GPU_CUDA compiles it against cuda_as_hip.hpp and
// links the CUDA runtime. The logic is the same for both vendors by
// construction, which is why the cuda backend on an H200 also proves the hip
// backend's logic.
#if defined(KVSTRAND_GPU_HIP)
#ifndef __HIP_PLATFORM_AMD__
#define __HIP_PLATFORM_AMD__ 1
#endif
#include <hip/hip_runtime_api.h>
#elif defined(KVSTRAND_GPU_CUDA)
#include "device/cuda_as_hip.hpp"
#else
#error "backend_gpu.cpp needs KVSTRAND_GPU_HIP or KVSTRAND_GPU_CUDA"
#endif

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <cstddef>
#include <cstring>
#include <string>

#include <vector>

#include "device/backend.hpp"
#include "device/mapped_ranges.hpp"
#include "device/sim_hooks.hpp"
#if defined(KVSTRAND_GPU_CUDA)
#include "device/segment_copy_kernel.hpp"
#include <spdlog/spdlog.h>
#endif

namespace kvstrand::device {
namespace {

Errc to_errc(hipError_t e) {
  if (e == hipSuccess) return Errc::success;
  if (e == hipErrorNotReady) return Errc::not_ready;
  if (e == hipErrorInvalidValue || e == hipErrorInvalidDevicePointer) return Errc::invalid_value;
  if (e == hipErrorOutOfMemory) return Errc::out_of_memory;
  if (e == hipErrorNoDevice || e == hipErrorInsufficientDriver) return Errc::no_device;
  if (e == hipErrorLaunchFailure) return Errc::launch_failure;
  if (e == hipErrorMapFailed) return Errc::ipc_failure;
  return Errc::backend_error;
}

Status check(hipError_t e, const char* call) {
  if (e == hipSuccess) return {};
  std::string msg = hipGetErrorName(e);
  msg += ": ";
  msg += hipGetErrorString(e);
  return {to_errc(e), call, std::move(msg)};
}

// IPC failures are reported under their own code whatever the vendor says,
// so callers can tell "cannot share" from "bad pointer".
Status check_ipc(hipError_t e, const char* call) {
  Status s = check(e, call);
  if (s.ok() || s.code() == Errc::invalid_value) return s;
  return {Errc::ipc_failure, call, s.message()};
}

hipMemcpyKind to_kind(CopyKind k) {
  switch (k) {
    case CopyKind::host_to_device: return hipMemcpyHostToDevice;
    case CopyKind::device_to_host: return hipMemcpyDeviceToHost;
    case CopyKind::device_to_device: return hipMemcpyDeviceToDevice;
  }
  return hipMemcpyDeviceToDevice;
}

hipStream_t as_stream(void* s) { return static_cast<hipStream_t>(s); }
hipEvent_t as_event(void* e) { return static_cast<hipEvent_t>(e); }

#if defined(KVSTRAND_GPU_HIP)
// HIP 5.2 declares hipLaunchHostFunc but its runtime does not export it; the
// stream callback it does export runs the same function in stream order.
struct HostFn {
  void (*fn)(void*);
  void* arg;
};
void run_host_fn(hipStream_t, hipError_t, void* p) {
  auto* h = static_cast<HostFn*>(p);
  h->fn(h->arg);
  delete h;
}
hipError_t launch_host_func(hipStream_t s, void (*fn)(void*), void* arg) {
  auto* h = new HostFn{fn, arg};
  hipError_t e = hipStreamAddCallback(s, &run_host_fn, h, 0);
  if (e != hipSuccess) delete h;
  return e;
}
#else
hipError_t launch_host_func(hipStream_t s, void (*fn)(void*), void* arg) { return hipLaunchHostFunc(s, fn, arg); }
#endif

#if defined(KVSTRAND_GPU_HIP)
hipError_t mem_address_range(void** base, std::size_t* size, const void* ptr) {
  hipDeviceptr_t b{};
  hipError_t e = hipMemGetAddressRange(&b, size, const_cast<void*>(ptr));
  *base = reinterpret_cast<void*>(b);
  return e;
}
#else
// The CUDA runtime has no address-range query; the driver's is looked up at
// run time so that the binaries need no libcuda at link time.
hipError_t mem_address_range(void** base, std::size_t* size, const void* ptr) {
  using Fn = int (*)(unsigned long long*, std::size_t*, unsigned long long);
  static Fn fn = [] {
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = ::dlopen("libcuda.so.1", RTLD_NOW);
    return lib ? reinterpret_cast<Fn>(::dlsym(lib, "cuMemGetAddressRange_v2")) : nullptr;
  }();
  if (fn == nullptr) return hipErrorInvalidValue;
  unsigned long long b = 0;
  if (fn(&b, size, reinterpret_cast<unsigned long long>(ptr)) != 0) return hipErrorInvalidValue;
  *base = reinterpret_cast<void*>(b);
  return hipSuccess;
}
#endif

static_assert(sizeof(hipIpcMemHandle_t) <= IpcHandle::opaque_size, "IPC handle does not fit");

#if defined(KVSTRAND_GPU_CUDA)
// The kernel reads and writes host memory through the device's mapping of
// it: only pinned memory the device can address counts (under unified
// addressing, cudaHostAlloc'd memory has the same address on both sides).
bool device_addressable(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return (a.type == cudaMemoryTypeHost || a.type == cudaMemoryTypeDevice) && a.devicePointer == p;
}
#endif

// What this process pinned that the kernel may read without asking again.
// Never destroyed: memory may be unpinned from any thread until exit.
MappedRanges& pinned_ranges() {
  static auto* ranges = new MappedRanges;
  return *ranges;
}

// Asked once per range, when it is pinned (the hip backend has no kernel).
void note_pinned([[maybe_unused]] void* p, [[maybe_unused]] std::size_t bytes) {
#if defined(KVSTRAND_GPU_CUDA)
  if (device_addressable(p)) pinned_ranges().add(p, bytes);
#endif
}
void forget_pinned(void* p) { pinned_ranges().remove(p); }

}  // namespace

namespace backend {

#if defined(KVSTRAND_GPU_HIP)
const char* name() noexcept { return "hip"; }
#else
const char* name() noexcept { return "cuda"; }
#endif
bool is_gpu() noexcept { return true; }

Status device_count(int* out) {
  *out = 0;
  hipError_t e = hipGetDeviceCount(out);
  // No device (or no driver) is an answer here, not a failure.
  if (e == hipErrorNoDevice || e == hipErrorInsufficientDriver) {
    *out = 0;
    return {};
  }
  return check(e, "hipGetDeviceCount");
}

Status device_name(int ordinal, std::string* out) {
  hipDeviceProp_t p{};
  if (Status s = check(hipGetDeviceProperties(&p, ordinal), "hipGetDeviceProperties"); !s.ok()) return s;
  *out = p.name;
  return {};
}

Status set_device(int ordinal) { return check(hipSetDevice(ordinal), "hipSetDevice"); }

Status device_malloc(void** out, std::size_t bytes) { return check(hipMalloc(out, bytes), "hipMalloc"); }
Status device_free(void* p) { return check(hipFree(p), "hipFree"); }
Status host_malloc(void** out, std::size_t bytes) {
  Status s = check(hipHostMalloc(out, bytes, hipHostMallocDefault), "hipHostMalloc");
  if (s.ok()) note_pinned(*out, bytes);
  return s;
}
Status host_free(void* p) {
  forget_pinned(p);
  return check(hipHostFree(p), "hipHostFree");
}
Status host_register(void* p, std::size_t bytes) {
  Status s = check(hipHostRegister(p, bytes, hipHostRegisterPortable | hipHostRegisterMapped), "hipHostRegister");
  if (s.ok()) note_pinned(p, bytes);
  return s;
}
Status host_unregister(void* p) {
  forget_pinned(p);
  return check(hipHostUnregister(p), "hipHostUnregister");
}

Status stream_create(void** out) {
  hipStream_t s = nullptr;
  // Non-blocking: kvstrand's copies must not serialise with the engine's
  // legacy default stream; ordering with the engine is by events only.
  if (Status st = check(hipStreamCreateWithFlags(&s, hipStreamNonBlocking), "hipStreamCreateWithFlags"); !st.ok())
    return st;
  *out = s;
  return {};
}
Status stream_destroy(void* s) { return check(hipStreamDestroy(as_stream(s)), "hipStreamDestroy"); }
Status stream_synchronize(void* s) { return check(hipStreamSynchronize(as_stream(s)), "hipStreamSynchronize"); }
Status stream_query(void* s) { return check(hipStreamQuery(as_stream(s)), "hipStreamQuery"); }
Status stream_host_func(void* s, void (*fn)(void*), void* arg) {
  return check(launch_host_func(as_stream(s), fn, arg), "hipLaunchHostFunc");
}

Status stream_wait_event(void* s, void* e) {
  return check(hipStreamWaitEvent(as_stream(s), as_event(e), 0), "hipStreamWaitEvent");
}

Status event_create(void** out) {
  hipEvent_t e = nullptr;
  if (Status s = check(hipEventCreateWithFlags(&e, hipEventDisableTiming), "hipEventCreateWithFlags"); !s.ok())
    return s;
  *out = e;
  return {};
}
Status event_destroy(void* e) { return check(hipEventDestroy(as_event(e)), "hipEventDestroy"); }
Status event_record(void* e, void* s) { return check(hipEventRecord(as_event(e), as_stream(s)), "hipEventRecord"); }
Status event_query(void* e) { return check(hipEventQuery(as_event(e)), "hipEventQuery"); }
Status event_synchronize(void* e) { return check(hipEventSynchronize(as_event(e)), "hipEventSynchronize"); }

Status memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, void* s) {
  return check(hipMemcpyAsync(dst, src, bytes, to_kind(kind), as_stream(s)), "hipMemcpyAsync");
}

#if defined(KVSTRAND_GPU_CUDA)
bool kernel_can_copy(std::span<const Segment> segs, CopyKind kind) {
  if (segs.size() < 2) return false;  // one contiguous run: the DMA engine is best
  if (kind == CopyKind::device_to_device) return true;
  // An arena this process pinned was asked about once, when pinned.
  if (pinned_ranges().host_sides_inside(segs, kind)) return true;
  // The host side of the first and the last segment (a batch's host side is
  // one tier arena in practice; both ends are checked to be safe).
  auto host = [kind](const Segment& g) { return kind == CopyKind::host_to_device ? g.src : g.dst; };
  return device_addressable(host(segs.front())) && device_addressable(host(segs.back()));
}
#endif

#if defined(KVSTRAND_GPU_CUDA) && CUDART_VERSION >= 12080
// A driver older than the runtime's 12.8 refuses the batched call: then the
// fastest path keeps to the kernel for good (said once).
std::atomic<bool> g_dma_batch_refused{false};

// One cudaMemcpyBatchAsync for the batch: the copy engines gather.
cudaError_t dma_batch(std::span<const Segment> segs, void* s) {
  std::vector<void*> dsts(segs.size());
  std::vector<const void*> srcs(segs.size());
  std::vector<std::size_t> sizes(segs.size());
  for (std::size_t i = 0; i < segs.size(); ++i) {
    dsts[i] = segs[i].dst;
    srcs[i] = segs[i].src;
    sizes[i] = segs[i].bytes;
  }
  // One attribute for all: sources read in stream order (a save's blocks
  // are read only after the engine's producer event, which the stream
  // waits for).
  cudaMemcpyAttributes attr{};
  attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  std::size_t first = 0;
  return cudaMemcpyBatchAsync(dsts.data(), srcs.data(), sizes.data(), segs.size(), &attr, &first, 1, as_stream(s));
}

bool dma_batch_refused(cudaError_t e) {
  if (e != cudaErrorNotSupported && e != cudaErrorCallRequiresNewerDriver) return false;
  (void)cudaGetLastError();
  if (!g_dma_batch_refused.exchange(true))
    spdlog::warn("kvstrand: cudaMemcpyBatchAsync refused ({}): saves' batches go through the kernel",
                 cudaGetErrorString(e));
  return true;
}
#endif

Status memcpy_batch_async(std::span<const Segment> segs, CopyKind kind, void* s, BatchVia via) {
#if defined(KVSTRAND_GPU_CUDA)
  // Whether the kernel can reach the host side, asked once (a pointer
  // query each end).
  std::optional<bool> kernel_ok;
  const auto kernel_fits = [&] {
    if (!kernel_ok) kernel_ok = kernel_can_copy(segs, kind);
    return *kernel_ok;
  };
#if CUDART_VERSION >= 12080
  // Device to host, the fastest path is the batched DMA: on the H200 it
  // saves at the contiguous copy's rate and several processes' saves
  // share the copy engines without loss, where the kernel's reads of the
  // device run at 0.96 and contend across processes (docs/performance-history.md,
  // fifteenth run). Host to device the kernel is faster, unless every
  // segment is large: the kernel's reads of host memory stay at the SMs'
  // rate, which the copy engines pass once each call moves 1 MiB or more
  // (bench_gather, per segment size).
  constexpr std::uint64_t kCopyEnginesWin = 1 << 20;
  const bool dma_faster = kind == CopyKind::device_to_host ||
                          std::all_of(segs.begin(), segs.end(), [](const Segment& g) { return g.bytes >= kCopyEnginesWin; });
  // `kernel` asked where the kernel cannot reach the host side (a host
  // range the device does not map): the copy engines gather instead.
  const bool batch = segs.size() >= 2 &&
                     (via == BatchVia::dma_batch || (via == BatchVia::fastest && dma_faster) ||
                      (via == BatchVia::kernel && !kernel_fits())) &&
                     !g_dma_batch_refused.load(std::memory_order_relaxed);
  if (batch) {
    const cudaError_t e = dma_batch(segs, s);
    if (!dma_batch_refused(e)) return check(static_cast<hipError_t>(e), "cudaMemcpyBatchAsync");
  }
#endif
  if ((via == BatchVia::fastest || via == BatchVia::kernel) && kernel_fits()) {
    std::vector<kernel::KernelSegment> table(segs.size());
    for (std::size_t i = 0; i < segs.size(); ++i)
      table[i] = {reinterpret_cast<std::uint64_t>(segs[i].src), reinterpret_cast<std::uint64_t>(segs[i].dst),
                  segs[i].bytes};
    return check(static_cast<hipError_t>(kernel::segment_copy(table.data(), static_cast<int>(table.size()), s)),
                 "segment_copy kernel launch");
  }
#else
  (void)via;  // no kernel and no batched DMA on the hip backend (Debian ships no hipcc to build a kernel)
#endif
  for (const Segment& g : segs)
    if (Status st = memcpy_async(g.dst, g.src, g.bytes, kind, s); !st.ok()) return st;
  return {};
}

bool batch_via_available(BatchVia via) noexcept {
  switch (via) {
    case BatchVia::per_segment:
    case BatchVia::fastest: return true;
    case BatchVia::kernel:
#if defined(KVSTRAND_GPU_CUDA)
      return true;
#else
      return false;
#endif
    case BatchVia::dma_batch:
#if defined(KVSTRAND_GPU_CUDA) && CUDART_VERSION >= 12080
      return !g_dma_batch_refused.load(std::memory_order_relaxed);
#else
      return false;
#endif
  }
  return false;
}

bool load_paths_differ() noexcept {
  return batch_via_available(BatchVia::kernel) && batch_via_available(BatchVia::dma_batch);
}

const char* fastest_batch_path() noexcept {
#if defined(KVSTRAND_GPU_CUDA) && CUDART_VERSION >= 12080
  return "saves: one cudaMemcpyBatchAsync a batch; loads: the path measured fastest for their segments' size "
         "(load_path=measure), else one gather/scatter kernel launch a batch (one cudaMemcpyBatchAsync when every "
         "segment is 1 MiB or more)";
#elif defined(KVSTRAND_GPU_CUDA)
  return "one gather/scatter kernel launch a batch";
#else
  return "one hipMemcpyAsync a segment";
#endif
}

Status ipc_export(void* device_base, IpcHandle* out) {
  hipIpcMemHandle_t h{};
  if (Status s = check_ipc(hipIpcGetMemHandle(&h, device_base), "hipIpcGetMemHandle"); !s.ok()) return s;
  std::memcpy(out->opaque.data(), &h, sizeof h);
  return {};
}

Status ipc_export_range(const void* ptr, IpcHandle* out, std::uint64_t* offset) {
  void* base = nullptr;
  std::size_t size = 0;
  if (Status s = check_ipc(mem_address_range(&base, &size, ptr), "hipMemGetAddressRange"); !s.ok()) return s;
  if (Status s = ipc_export(base, out); !s.ok()) return s;
  out->bytes = size;
  *offset = static_cast<std::uint64_t>(static_cast<const std::byte*>(ptr) - static_cast<const std::byte*>(base));
  return {};
}

Status ipc_open(const IpcHandle& handle, void** out) {
  hipIpcMemHandle_t h{};
  std::memcpy(&h, handle.opaque.data(), sizeof h);
  return check_ipc(hipIpcOpenMemHandle(out, h, hipIpcMemLazyEnablePeerAccess), "hipIpcOpenMemHandle");
}

Status ipc_close(void* p) { return check_ipc(hipIpcCloseMemHandle(p), "hipIpcCloseMemHandle"); }

}  // namespace backend

namespace sim {

bool available() noexcept { return false; }

namespace {
Status unsupported(const char* call) { return {Errc::not_supported, call, "sim hooks exist only on the sim backend"}; }
}  // namespace

Status set_stream_delay(Stream&, std::chrono::microseconds) { return unsupported("sim::set_stream_delay"); }
Status hold_stream(Stream&) { return unsupported("sim::hold_stream"); }
Status release_stream(Stream&) { return unsupported("sim::release_stream"); }
Status fail_copies(Stream&, FailAt, Errc, int) { return unsupported("sim::fail_copies"); }
Status set_load_path_cost(LoadPath, std::chrono::nanoseconds, std::chrono::nanoseconds) {
  return unsupported("sim::set_load_path_cost");
}
std::uint64_t batches_by(LoadPath) noexcept { return 0; }

}  // namespace sim
}  // namespace kvstrand::device
