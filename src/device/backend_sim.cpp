// The sim backend: a CPU device that is real in every way the reactor sees.
//
// - A stream is a FIFO executor on its own host thread.
// - Copies move real bytes (memcpy) when the stream reaches them.
// - An event completes when its stream reaches the record.
// - Device memory is a memfd mapping, so an IpcHandle (pid, fd, nonce) opens
//   in another process of the same user through /proc/<pid>/fd/<fd>.
// - Device and pinned memory are mapped with MAP_POPULATE: resident from the
//   start, as on a GPU, so no copy pays first-touch page faults that real
//   hardware would not (an IPC mapping is populated when opened, too).
// - Device pointers are checked against the live allocations, as a GPU
//   runtime would refuse a pointer it did not hand out.
//
// The locks here belong to the emulated device, not to transfer state: they
// stand in for the hardware queues a GPU runtime synchronises internally.
#include <pthread.h>
#include <atomic>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "device/backend.hpp"
#include "device/sim_hooks.hpp"
#include "device/sim_stream.hpp"
#include "device/stream.hpp"

namespace kvstrand::device {
namespace {

using simdev::EventBox;
using simdev::Op;
using simdev::SimEvent;
using simdev::SimStream;

constexpr std::uint32_t kMagic = 0x5353564b;  // "KVSS"

std::string errno_text(int e) { return std::strerror(e); }

std::size_t page_round(std::size_t n) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

// ---- memory -------------------------------------------------------------

struct Allocation {
  std::size_t bytes = 0;   // requested
  std::size_t mapped = 0;  // page-rounded
  int fd = -1;             // -1 for imported mappings
  std::uint64_t nonce = 0;
};

class Memory {
 public:
  static Memory& get() {
    static Memory m;
    return m;
  }

  void add(void* p, Allocation a) {
    std::lock_guard lk(m_);
    device_[reinterpret_cast<std::uintptr_t>(p)] = a;
  }
  std::optional<Allocation> remove(void* p) {
    std::lock_guard lk(m_);
    auto it = device_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == device_.end()) return std::nullopt;
    Allocation a = it->second;
    device_.erase(it);
    return a;
  }
  // The allocation containing p, with its base.
  std::optional<std::pair<std::uintptr_t, Allocation>> find_containing(const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lk(m_);
    auto it = device_.upper_bound(a);
    if (it == device_.begin()) return std::nullopt;
    --it;
    if (a - it->first >= it->second.bytes) return std::nullopt;
    return *it;
  }
  std::optional<Allocation> find_base(const void* p) {
    std::lock_guard lk(m_);
    auto it = device_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == device_.end()) return std::nullopt;
    return it->second;
  }
  // True when [p, p+n) lies inside one live device allocation.
  bool is_device_range(const void* p, std::size_t n) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard lk(m_);
    auto it = device_.upper_bound(a);
    if (it == device_.begin()) return false;
    --it;
    return a >= it->first && n <= it->second.bytes && a - it->first <= it->second.bytes - n;
  }

  void add_host(void* p, std::size_t mapped) {
    std::lock_guard lk(m_);
    host_[reinterpret_cast<std::uintptr_t>(p)] = mapped;
  }
  std::optional<std::size_t> remove_host(void* p) {
    std::lock_guard lk(m_);
    auto it = host_.find(reinterpret_cast<std::uintptr_t>(p));
    if (it == host_.end()) return std::nullopt;
    std::size_t n = it->second;
    host_.erase(it);
    return n;
  }

 private:
  std::mutex m_;
  std::map<std::uintptr_t, Allocation> device_;
  std::map<std::uintptr_t, std::size_t> host_;
};

std::uint64_t random_nonce() {
  static std::mutex m;
  static std::mt19937_64 rng{std::random_device{}()};
  std::lock_guard lk(m);
  return rng() | 1;  // never zero
}

std::string memfd_name(std::uint64_t nonce) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "kvstrand-sim-%016llx", static_cast<unsigned long long>(nonce));
  return buf;
}

SimStream* as_stream(void* s) { return static_cast<SimStream*>(s); }
EventBox* as_event(void* e) { return static_cast<EventBox*>(e); }

const char* copy_call(CopyKind k) {
  switch (k) {
    case CopyKind::host_to_device: return "hipMemcpyAsync(H2D)";
    case CopyKind::device_to_host: return "hipMemcpyAsync(D2H)";
    case CopyKind::device_to_device: return "hipMemcpyAsync(D2D)";
  }
  return "hipMemcpyAsync";
}

Status check_segment(const Segment& g, CopyKind kind) {
  auto& mem = Memory::get();
  const bool src_dev = kind != CopyKind::host_to_device;
  const bool dst_dev = kind != CopyKind::device_to_host;
  if (src_dev && !mem.is_device_range(g.src, g.bytes))
    return {Errc::invalid_value, copy_call(kind), "sim: source is not inside a device allocation"};
  if (dst_dev && !mem.is_device_range(g.dst, g.bytes))
    return {Errc::invalid_value, copy_call(kind), "sim: destination is not inside a device allocation"};
  return {};
}

// The load paths' injected costs and counts (sim::set_load_path_cost).
struct PathCost {
  std::atomic<std::int64_t> per_segment_ns{0}, per_mib_ns{0};
  std::atomic<std::uint64_t> batches{0};
};
PathCost g_path_cost[2];  // by LoadPath
std::atomic<bool> g_paths_differ{false};

PathCost& cost_of(LoadPath p) { return g_path_cost[p == LoadPath::kernel ? 0 : 1]; }

Status submit_copy(std::span<const Segment> segs, CopyKind kind, void* s,
                   std::chrono::nanoseconds cost = std::chrono::nanoseconds(0)) {
  if (s == nullptr) return {Errc::invalid_value, copy_call(kind), "null stream"};
  for (const Segment& g : segs)
    if (Status st = check_segment(g, kind); !st.ok()) return st;
  SimStream* st = as_stream(s);
  if (Errc e = st->take_submit_failure(); e != Errc::success)
    return {e, copy_call(kind), "sim: failure injected at submit"};
  Op op;
  op.kind = Op::Kind::copy;
  op.segs.assign(segs.begin(), segs.end());
  op.cost = cost;
  op.fail = st->take_execute_failure();
  st->push(std::move(op));
  return {};
}

}  // namespace

// ---- backend ------------------------------------------------------------

namespace backend {

const char* name() noexcept { return "sim"; }
bool is_gpu() noexcept { return false; }

Status device_count(int* out) {
  *out = 1;
  return {};
}
Status device_name(int ordinal, std::string* out) {
  if (ordinal != 0) return {Errc::invalid_value, "hipGetDeviceProperties", "sim has one device"};
  *out = "kvstrand sim device (CPU)";
  return {};
}
Status set_device(int ordinal) {
  if (ordinal != 0) return {Errc::invalid_value, "hipSetDevice", "sim has one device"};
  return {};
}

Status device_malloc(void** out, std::size_t bytes) {
  const std::uint64_t nonce = random_nonce();
  const int fd = ::memfd_create(memfd_name(nonce).c_str(), MFD_CLOEXEC);
  if (fd < 0) return {Errc::out_of_memory, "hipMalloc", "memfd_create: " + errno_text(errno)};
  const std::size_t mapped = page_round(bytes);
  if (::ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
    const int e = errno;
    ::close(fd);
    return {Errc::out_of_memory, "hipMalloc", "ftruncate: " + errno_text(e)};
  }
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    const int e = errno;
    ::close(fd);
    return {Errc::out_of_memory, "hipMalloc", "mmap: " + errno_text(e)};
  }
  Memory::get().add(p, {bytes, mapped, fd, nonce});
  *out = p;
  return {};
}

Status device_free(void* p) {
  auto a = Memory::get().remove(p);
  if (!a || a->fd < 0) return {Errc::invalid_value, "hipFree", "sim: not a device allocation of this process"};
  ::munmap(p, a->mapped);
  ::close(a->fd);
  return {};
}

Status host_malloc(void** out, std::size_t bytes) {
  const std::size_t mapped = page_round(bytes);
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (p == MAP_FAILED) return {Errc::out_of_memory, "hipHostMalloc", "mmap: " + errno_text(errno)};
  Memory::get().add_host(p, mapped);
  *out = p;
  return {};
}

Status host_free(void* p) {
  auto n = Memory::get().remove_host(p);
  if (!n) return {Errc::invalid_value, "hipHostFree", "sim: not a pinned allocation"};
  ::munmap(p, *n);
  return {};
}

// Pinning: the range is checked to be mapped, as a runtime would refuse an
// unmapped one, and faulted in.
Status host_register(void* p, std::size_t bytes) {
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto base = reinterpret_cast<std::uintptr_t>(p) / page * page;
  const std::size_t len = page_round(reinterpret_cast<std::uintptr_t>(p) - base + bytes);
  std::vector<unsigned char> vec(len / page);
  // mincore fails with ENOMEM when any page of the range is unmapped.
  if (::mincore(reinterpret_cast<void*>(base), len, vec.data()) != 0 && errno == ENOMEM)
    return {Errc::invalid_value, "hipHostRegister", "sim: the range is not mapped"};
  // A GPU runtime faults every page in when it pins them: so does the sim,
  // so that no copy pays first-touch faults real hardware would not.
  constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE (Linux 5.14); older kernels fault on first touch
  (void)::madvise(reinterpret_cast<void*>(base), len, kPopulateWrite);
  return {};
}
Status host_unregister(void*) { return {}; }

Status stream_create(void** out) {
  *out = new SimStream();
  return {};
}
Status stream_destroy(void* s) {
  delete as_stream(s);
  return {};
}
Status stream_synchronize(void* s) {
  as_stream(s)->synchronize();
  return {};
}
Status stream_query(void* s) {
  if (!as_stream(s)->idle()) return {Errc::not_ready, "hipStreamQuery"};
  return {};
}
Status stream_host_func(void* s, void (*fn)(void*), void* arg) {
  Op op;
  op.kind = Op::Kind::host_func;
  op.fn = fn;
  op.arg = arg;
  as_stream(s)->push(std::move(op));
  return {};
}

Status stream_wait_event(void* s, void* e) {
  if (e == nullptr || s == nullptr) return {Errc::invalid_value, "hipStreamWaitEvent", "null handle"};
  Op op;
  op.kind = Op::Kind::wait;
  op.ev = as_event(e)->ev;
  {
    std::lock_guard lk(op.ev->m);
    op.gen = op.ev->recorded;  // 0 (never recorded): nothing to wait for
  }
  as_stream(s)->push(std::move(op));
  return {};
}

Status event_create(void** out) {
  *out = new EventBox();
  return {};
}
Status event_destroy(void* e) {
  delete as_event(e);
  return {};
}
Status event_record(void* e, void* s) {
  if (e == nullptr || s == nullptr) return {Errc::invalid_value, "hipEventRecord", "null handle"};
  Op op;
  op.kind = Op::Kind::record;
  op.ev = as_event(e)->ev;
  {
    std::lock_guard lk(op.ev->m);
    op.gen = ++op.ev->recorded;
  }
  as_stream(s)->push(std::move(op));
  return {};
}
Status event_query(void* e) {
  SimEvent& ev = *as_event(e)->ev;
  std::lock_guard lk(ev.m);
  return ev.status_locked("hipEventQuery");
}
Status event_synchronize(void* e) {
  SimEvent& ev = *as_event(e)->ev;
  std::unique_lock lk(ev.m);
  ev.cv.wait(lk, [&] { return ev.completed >= ev.recorded; });
  return ev.status_locked("hipEventSynchronize");
}

Status memcpy_async(void* dst, const void* src, std::size_t bytes, CopyKind kind, void* s) {
  const Segment g{src, dst, bytes};
  return submit_copy({&g, 1}, kind, s);
}
Status memcpy_batch_async(std::span<const Segment> segs, CopyKind kind, void* s, BatchVia via) {
  // One stream operation for the whole batch, whichever way; a path named
  // is counted and costs what a test set.
  if (via != BatchVia::kernel && via != BatchVia::dma_batch) return submit_copy(segs, kind, s);
  PathCost& c = cost_of(via == BatchVia::kernel ? LoadPath::kernel : LoadPath::dma_batch);
  std::uint64_t bytes = 0;
  for (const Segment& g : segs) bytes += g.bytes;
  const auto cost = std::chrono::nanoseconds(
      c.per_segment_ns.load() * static_cast<std::int64_t>(segs.size()) +
      static_cast<std::int64_t>(static_cast<double>(c.per_mib_ns.load()) * static_cast<double>(bytes) / (1 << 20)));
  Status st = submit_copy(segs, kind, s, cost);
  if (st.ok()) ++c.batches;
  return st;
}
bool batch_via_available(BatchVia) noexcept { return true; }  // the sim moves a batch as one operation, whichever way
bool load_paths_differ() noexcept { return g_paths_differ.load(); }
const char* fastest_batch_path() noexcept { return "one sim stream operation a batch"; }

Status ipc_export(void* device_base, IpcHandle* out) {
  auto a = Memory::get().find_base(device_base);
  if (!a || a->fd < 0)
    return {Errc::invalid_value, "hipIpcGetMemHandle", "sim: not the base of a device allocation of this process"};
  std::uint32_t magic = kMagic;
  std::uint32_t pid = static_cast<std::uint32_t>(::getpid());
  std::int32_t fd = a->fd;
  std::byte* o = out->opaque.data();
  std::memcpy(o, &magic, 4);
  std::memcpy(o + 4, &pid, 4);
  std::memcpy(o + 8, &fd, 4);
  std::memcpy(o + 16, &a->nonce, 8);
  return {};
}

Status ipc_export_range(const void* ptr, IpcHandle* out, std::uint64_t* offset) {
  auto found = Memory::get().find_containing(ptr);
  if (!found || found->second.fd < 0)
    return {Errc::invalid_value, "hipIpcGetMemHandle", "sim: not inside a device allocation of this process"};
  if (Status s = ipc_export(reinterpret_cast<void*>(found->first), out); !s.ok()) return s;
  out->bytes = found->second.bytes;
  *offset = reinterpret_cast<std::uintptr_t>(ptr) - found->first;
  return {};
}

Status ipc_open(const IpcHandle& h, void** out) {
  std::uint32_t magic = 0, pid = 0;
  std::int32_t fd = -1;
  std::uint64_t nonce = 0;
  const std::byte* o = h.opaque.data();
  std::memcpy(&magic, o, 4);
  std::memcpy(&pid, o + 4, 4);
  std::memcpy(&fd, o + 8, 4);
  std::memcpy(&nonce, o + 16, 8);
  if (magic != kMagic) return {Errc::invalid_value, "hipIpcOpenMemHandle", "sim: not a sim IPC handle"};
  // As on a GPU runtime, a process cannot import its own export.
  if (pid == static_cast<std::uint32_t>(::getpid()))
    return {Errc::ipc_failure, "hipIpcOpenMemHandle", "sim: handle was exported by this process"};
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  // The nonce in the memfd's name proves the fd is still the exported
  // allocation and not a reused descriptor number.
  char target[256] = {};
  const ssize_t n = ::readlink(path.c_str(), target, sizeof target - 1);
  if (n < 0) return {Errc::ipc_failure, "hipIpcOpenMemHandle", "sim: exporter is gone: " + errno_text(errno)};
  if (std::string_view(target, static_cast<std::size_t>(n)).find(memfd_name(nonce)) == std::string_view::npos)
    return {Errc::ipc_failure, "hipIpcOpenMemHandle", "sim: the exported allocation was freed"};
  const int mfd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (mfd < 0) return {Errc::ipc_failure, "hipIpcOpenMemHandle", "sim: open " + path + ": " + errno_text(errno)};
  struct stat st {};
  if (::fstat(mfd, &st) != 0 || static_cast<std::uint64_t>(st.st_size) < h.bytes) {
    ::close(mfd);
    return {Errc::ipc_failure, "hipIpcOpenMemHandle", "sim: allocation is smaller than the handle says"};
  }
  const std::size_t mapped = static_cast<std::size_t>(st.st_size);
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, mfd, 0);
  const int e = errno;
  ::close(mfd);
  if (p == MAP_FAILED) return {Errc::ipc_failure, "hipIpcOpenMemHandle", "sim: mmap: " + errno_text(e)};
  Memory::get().add(p, {static_cast<std::size_t>(h.bytes), mapped, -1, nonce});
  *out = p;
  return {};
}

Status ipc_close(void* p) {
  auto a = Memory::get().remove(p);
  if (!a || a->fd >= 0) return {Errc::invalid_value, "hipIpcCloseMemHandle", "sim: not an imported mapping"};
  ::munmap(p, a->mapped);
  return {};
}

}  // namespace backend

// ---- hooks --------------------------------------------------------------

namespace sim {

bool available() noexcept { return true; }

Status set_stream_delay(Stream& s, std::chrono::microseconds d) {
  as_stream(s.native())->set_delay(d);
  return {};
}
Status hold_stream(Stream& s) {
  as_stream(s.native())->hold(true);
  return {};
}
Status release_stream(Stream& s) {
  as_stream(s.native())->hold(false);
  return {};
}
Status fail_copies(Stream& s, FailAt at, Errc code, int count) {
  if (count < 0 || code == Errc::success) return {Errc::invalid_value, "sim::fail_copies"};
  as_stream(s.native())->fail(at, code, count);
  return {};
}
Status set_load_path_cost(LoadPath path, std::chrono::nanoseconds per_segment, std::chrono::nanoseconds per_mib) {
  if (per_segment.count() < 0 || per_mib.count() < 0) return {Errc::invalid_value, "sim::set_load_path_cost"};
  PathCost& c = cost_of(path);
  c.per_segment_ns = per_segment.count();
  c.per_mib_ns = per_mib.count();
  bool any = false;
  for (const PathCost& p : g_path_cost) any = any || p.per_segment_ns.load() > 0 || p.per_mib_ns.load() > 0;
  g_paths_differ = any;
  return {};
}
std::uint64_t batches_by(LoadPath path) noexcept { return cost_of(path).batches.load(); }

}  // namespace sim
}  // namespace kvstrand::device
