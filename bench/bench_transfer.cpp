// Load latency of the reference geometry through the embedded tier (batched
// copies by the path measured fastest on this host (load_path=measure; the
// measured figures and the path taken are printed), by each of the DMA
// batch and the gather kernel forced, and one copy a segment) and through
// kvstrand-server, each against one contiguous copy of the same bytes
// measured in the same run; sustained save throughput with 16 saves in
// flight against one contiguous D2H copy; then save throughput of 1, 2, 4
// and 8 client processes saving into one server at once.
//
// Geometry: 5 planes, 739,840 B per block across them, 16-token blocks,
// 256-token chunks, a pool of 4000 blocks (--pool-blocks to shrink it), and
// a 1 MiB checkpoint image. The load is the seed's: 28 blocks (tokens
// [64, 512): two chunk objects, the first entered mid-chunk) into scattered
// destination blocks, with the image at 512. Latency: from load() to the
// completion being visible to finished() (polled in a tight loop). Baseline:
// one H2D copy of the same byte count from pinned memory, awaited by event,
// run right after each load; and the load's batch of segments alone, by the
// same copy path without kvstrand around it (its floor).
//
// Scaling: each client process registers its own pool and saves distinct
// 2-chunk prompts (32 blocks + 2 images, 25.8 MB) back to back, 2 in flight,
// during the same window; aggregate GB/s = bytes of the saves completed in
// the window / window. The server is the kvstrand-server built beside this
// benchmark (../kvstrand-server), on a private socket. Baseline, in the same
// run: as many raw clients, each copying the same 25.8 MB with one
// contiguous D2H copy, 2 in flight, into its own slots of one shared host
// arena (a memfd every client maps and pins, as kvstrand clients map and
// pin the server's arena): what the GPU and the host give N processes
// without kvstrand.
//
// --client-path per-segment: the scaling clients copy one segment at a time
// (the copy engines) instead of the backend's fastest batch path (a
// gather/scatter kernel on a GPU), to tell the two apart; dma-batch: one
// batched DMA call a batch (cudaMemcpyBatchAsync: the copy engines gather).
// The embedded load and the save throughput are also measured by the DMA
// batch path, in the same run.
//
// --split: each load's time is also split where the engine can see it: when
// order_after_load() first answers `ordered` (its copies are queued), when
// an event the bench's stream records after that order completes (the
// copies are done on the device), and when finished() returns its end. The
// bench thread then polls two calls more in its loop, so the load figures
// of a --split run are not the plain ones'.
//
// --trace: each load's steps timed (common::LoadTrace, points through the
// Connector, the strand and the copy) and each step's p50 and p99 printed
// after the load figures: where kvstrand's own share of a load goes. With
// --split, also how long after the bench saw its own event (recorded after
// the load's copies) complete the strand saw the load's.
//
// --idle-spin US: the reactor's idle spin (ConnectorOptions::reactor_idle_spin)
// of the measured loads' Connectors, embedded and node tier.
//
// --idle-ms MS: the bench sleeps MS before each load's lookup, as an engine
// idle between requests: past the idle spin the reactor is asleep when the
// lookup comes, and the load that follows it shows whether it finds the
// reactor awake again. Each load is then followed also by one contiguous
// copy and by the batch alone, each after the same idle: what waking the
// host and the device costs without kvstrand, the after-idle load's floor.
//
// usage: bench_transfer [--iterations N] [--pool-blocks N] [--clients 1,2,4,8]
//                       [--seconds S] [--no-server] [--client-path fastest|per-segment|dma-batch] [--split]
//                       [--load-path rule|measure|kernel|dma-batch]
//                       [--idle-spin US] [--idle-ms MS] [--trace]
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "device/copy.hpp"
#include "device/load_path.hpp"
#include "device/device.hpp"
#include "device/device_buffer.hpp"
#include "device/event.hpp"
#include "device/host_registration.hpp"
#include "device/pinned_buffer.hpp"
#include "device/stream.hpp"
#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/namespace_id.hpp>
#include "percentile.hpp"
#include "common/load_trace.hpp"
#include "connector/connector.hpp"
#include "reference_geometry.hpp"
#include "save_scaling.hpp"


using namespace kvstrand;
using kvstrand::bench::pct;
using namespace kvstrand::bench;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

kvstrand::Finished wait_one(connector::Connector& c) {
  for (;;) {
    auto f = c.finished();
    if (!f.saves.empty() || !f.loads.empty()) return f;
  }
}

struct LoadFigures {
  std::vector<double> load_us, copy_us, batch_us;
  // --split: from load() to its copies queued, and to those copies done.
  std::vector<double> queued_us, done_us;
  // The same batch from host memory made as the node tier's arena is.
  std::vector<double> shared_batch_us, huge_batch_us;
  std::string no_huge;  // why there are no huge-page figures
  // --idle-ms: one contiguous copy and the batch alone, each after the same
  // idle as the load's lookup: what waking costs without kvstrand.
  std::vector<double> idle_copy_us, idle_batch_us;
  // --trace: per step, from the point before it (common::LoadTrace); and
  // with --split, from the bench's own event done to the strand's `seen`.
  std::vector<std::vector<double>> step_us = std::vector<std::vector<double>>(common::LoadTrace::kPoints);
  std::vector<double> seen_after_done_us;
  std::vector<double> ticks;  // --trace: the poller's ticks during each load
};

// Host memory as kvstrand-server's arena is: a memfd mapped shared, its
// pages faulted in, registered with the device (hipHostRegister) rather
// than allocated pinned by it; with 4 KiB pages, or huge ones when the
// system has them reserved. A load through the node tier gathers from such
// memory, the embedded tier's loads from pinned memory: this tells what the
// memory itself costs the batch.
class SharedSource {
 public:
  // None when the memory cannot be had (huge: none reserved), and why.
  static std::unique_ptr<SharedSource> make(std::size_t bytes, bool huge, std::string* why) {
    constexpr std::size_t kHuge = 2ull << 20;
    if (huge) bytes = (bytes + kHuge - 1) / kHuge * kHuge;
    const int fd = ::memfd_create("bench_transfer-shared", MFD_CLOEXEC | (huge ? MFD_HUGETLB : 0u));
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      *why = std::string("memfd: ") + std::strerror(errno);
      if (fd >= 0) ::close(fd);
      return nullptr;
    }
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    ::close(fd);  // the mapping keeps the file
    if (p == MAP_FAILED) {
      *why = std::string("mmap: ") + std::strerror(errno);
      return nullptr;
    }
    std::unique_ptr<SharedSource> m(new SharedSource(static_cast<std::byte*>(p), bytes));
    std::memset(m->data_, 0x33, bytes);
    auto reg = device::HostRegistration::register_range(m->data_, bytes);
    if (!reg.ok()) {
      *why = reg.status().describe();
      return nullptr;
    }
    m->reg_.emplace(std::move(reg).value());
    return m;
  }
  ~SharedSource() {
    reg_.reset();  // unregistered before the memory goes
    ::munmap(data_, bytes_);
  }
  std::byte* data() const { return data_; }

 private:
  SharedSource(std::byte* p, std::size_t n) : data_(p), bytes_(n) {}
  std::byte* data_;
  std::size_t bytes_;
  std::optional<device::HostRegistration> reg_;
};

bool split = false;  // --split
bool trace = false;  // --trace
std::chrono::microseconds idle_spin = connector::ConnectorOptions{}.reactor_idle_spin;  // --idle-spin
std::chrono::milliseconds idle_before_lookup{0};                                     // --idle-ms

// Saves prompt 0 once, then loads its tokens [64, 512) `iterations` times
// into scattered blocks, each followed by one contiguous copy of as many
// bytes and by the load's batch alone: the same 141 segments (28 blocks of
// 5 planes, the image) from pinned memory into the same scattered blocks by
// copy_batch on a stream of its own, launched and awaited like the
// contiguous copy. That is the batch path's own floor on this device; the
// load's time above it is kvstrand's (the ring, the strand, the poller, the
// mailbox). The same batch is then run from a SharedSource of 4 KiB pages
// and, where huge pages are reserved, of huge pages.
LoadFigures measure_loads(connector::Connector& conn, Pool& pool, const kv::Layout& l, int iterations) {
  std::mt19937 rng(1);
  auto scattered = [&](std::size_t n) {
    std::vector<kv::BlockId> v;
    while (v.size() < n) {
      const kv::BlockId b = rng() % pool.blocks;
      if (std::find(v.begin(), v.end(), b) == v.end()) v.push_back(b);
    }
    return v;
  };
  // A node tier that has just started may have no slab ready yet: it
  // refuses (tier_full) until its first slab is populated.
  const auto ready_by = Clock::now() + std::chrono::seconds(30);
  for (;;) {
    conn.save(save_spec(l, 0, scattered(32)));
    auto f = wait_one(conn);
    if (f.saves[0].ok) break;
    if (f.saves[0].error != kvstrand::TransferErrc::tier_full || Clock::now() > ready_by)
      die("save failed: " + f.saves[0].reason);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  const std::size_t load_bytes = 28 * kBlockBytes + kImageBytes;
  auto stream = must(device::Stream::create(), "stream");
  auto src = must(device::PinnedBuffer::allocate(load_bytes), "pinned");
  std::memset(src.data(), 0x33, src.size());
  std::string why_not;
  const auto shared = SharedSource::make(load_bytes, false, &why_not);
  if (!shared) die("shared memory source: " + why_not);
  LoadFigures fig;
  const auto huge = SharedSource::make(load_bytes, true, &fig.no_huge);
  auto dst = must(device::DeviceBuffer::allocate(load_bytes), "device");
  auto ev = must(device::Event::create(), "event");
  const auto keys = prompt_keys(l, 0);
  for (int i = 0; i < iterations; ++i) {
    kv::TransferSpec s;
    s.request = "load";
    s.tokens = {64, 512};
    s.keys = keys;
    s.blocks = scattered(28);
    const std::vector<kv::BlockId> blocks = s.blocks;
    s.with_state = true;
    s.state_slots = {2};
    // As an engine does: the lookup at admission (untimed), the load naming
    // its lease later (the node tier copies without asking the server).
    std::this_thread::sleep_for(idle_before_lookup);
    conn.lookup(keys);
    for (bool answered = false; !answered;)
      for (const auto& lk : conn.finished().lookups) {
        s.tier_lease = lk.lease;
        answered = true;
      }
    auto us_since = [](Clock::time_point t) { return std::chrono::duration<double, std::micro>(Clock::now() - t).count(); };
    common::LoadTrace::clear();
    const std::uint64_t ticks_before = trace ? conn.poller_stats().ticks : 0;
    std::int64_t done_ns = 0;
    const auto t0 = Clock::now();
    conn.load(std::move(s));
    kvstrand::Finished f;
    if (split) {
      double queued = -1, done = -1;
      for (;;) {
        if (queued < 0 && conn.order_after_load("load", stream) == LoadOrder::ordered) {
          queued = us_since(t0);
          (void)ev.record(stream);
        }
        if (queued >= 0 && done < 0 && ev.query().ok()) {
          done = us_since(t0);
          done_ns = common::LoadTrace::now_ns();
        }
        f = conn.finished();
        if (!f.loads.empty()) break;
      }
      fig.load_us.push_back(us_since(t0));
      (void)ev.synchronize();  // an end seen before the bench's own event: still waited for here
      fig.queued_us.push_back(queued);
      fig.done_us.push_back(done < 0 ? fig.load_us.back() : done);
    } else {
      f = wait_one(conn);
      fig.load_us.push_back(us_since(t0));
    }
    if (!f.loads[0].ok) die("load failed: " + f.loads[0].reason);
    if (trace) {
      using T = common::LoadTrace;
      for (int p = 1; p < T::kPoints; ++p) {
        const std::int64_t a = T::at(static_cast<T::Point>(p - 1)), b = T::at(static_cast<T::Point>(p));
        if (a != 0 && b != 0) fig.step_us[p].push_back(static_cast<double>(b - a) / 1e3);
      }
      fig.ticks.push_back(static_cast<double>(conn.poller_stats().ticks - ticks_before));
      if (done_ns != 0 && T::at(T::seen) != 0)
        fig.seen_after_done_us.push_back(static_cast<double>(T::at(T::seen) - done_ns) / 1e3);
    }
    // One contiguous copy of the load's bytes, timed into `into`.
    auto contiguous = [&](std::vector<double>& into) {
      const auto t1 = Clock::now();
      (void)device::copy_h2d(stream, dst.data(), src.data(), load_bytes);
      (void)ev.record(stream);
      (void)ev.synchronize();
      into.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t1).count());
    };
    contiguous(fig.copy_us);
    // The load's batch alone from `from`, timed into `into`.
    auto batch_from = [&](std::byte* from, std::vector<double>& into) {
      std::vector<device::Segment> segs;
      const std::uint64_t plane_bytes = kBlockBytes / 5;
      std::uint64_t at = 0;
      for (std::size_t p = 0; p < pool.planes.size(); ++p)
        for (const kv::BlockId b : blocks) {
          segs.push_back({from + at, pool.planes[p].data() + b * plane_bytes, plane_bytes});
          at += plane_bytes;
        }
      segs.push_back({from + at, pool.state.data() + 2 * kImageBytes, kImageBytes});
      const auto t2 = Clock::now();
      if (auto st = device::copy_batch(stream, device::CopyKind::host_to_device, segs); !st.ok()) die("batch: " + st.message());
      (void)ev.record(stream);
      (void)ev.synchronize();
      into.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t2).count());
    };
    batch_from(src.data(), fig.batch_us);
    batch_from(shared->data(), fig.shared_batch_us);
    if (huge) batch_from(huge->data(), fig.huge_batch_us);
    if (idle_before_lookup.count() > 0) {
      std::this_thread::sleep_for(idle_before_lookup);
      contiguous(fig.idle_copy_us);
      std::this_thread::sleep_for(idle_before_lookup);
      batch_from(src.data(), fig.idle_batch_us);
    }
  }
  return fig;
}

struct LoadRatios {
  double load = 0, batch_alone = 0;  // to one contiguous copy
  double shared_batch = 0;           // the batch from shared 4 KiB pages, to one contiguous copy
};

LoadRatios report(const char* path, const LoadFigures& f) {
  const double mb = static_cast<double>(28 * kBlockBytes + kImageBytes) / 1e3;  // bytes/us = MB/s; /1e3 -> GB/s
  const double ratio = pct(f.load_us, 0.5) / pct(f.copy_us, 0.5);
  std::printf("  %-22s load us: p50 %6.0f p99 %6.0f (%5.1f GB/s) | contiguous copy us: p50 %6.0f p99 %6.0f "
              "(%5.1f GB/s) | ratio %.2f | the batch alone us: p50 %6.0f (ratio %.2f)\n",
              path, pct(f.load_us, 0.5), pct(f.load_us, 0.99), mb / pct(f.load_us, 0.5), pct(f.copy_us, 0.5),
              pct(f.copy_us, 0.99), mb / pct(f.copy_us, 0.5), ratio, pct(f.batch_us, 0.5),
              pct(f.batch_us, 0.5) / pct(f.copy_us, 0.5));
  const double copy = pct(f.copy_us, 0.5);
  char huge[64];
  if (!f.huge_batch_us.empty())
    std::snprintf(huge, sizeof huge, "p50 %.0f us (ratio %.2f)", pct(f.huge_batch_us, 0.5),
                  pct(f.huge_batch_us, 0.5) / copy);
  std::printf("  %-22s the batch alone from shared memory (a registered memfd): 4 KiB pages p50 %6.0f us (ratio %.2f); "
              "huge pages %s\n",
              "", pct(f.shared_batch_us, 0.5), pct(f.shared_batch_us, 0.5) / copy,
              f.huge_batch_us.empty() ? ("none: " + f.no_huge).c_str() : huge);
  if (!f.queued_us.empty()) {
    std::vector<double> tail;  // from the copies done to the end seen, per load
    for (std::size_t i = 0; i < f.done_us.size(); ++i) tail.push_back(f.load_us[i] - f.done_us[i]);
    std::printf("  %-22s split, us from load(): copies queued p50 %.1f p99 %.1f; copies done p50 %.0f p99 %.0f; "
                "then the end seen p50 %.1f p99 %.1f later\n",
                "", pct(f.queued_us, 0.5), pct(f.queued_us, 0.99), pct(f.done_us, 0.5), pct(f.done_us, 0.99),
                pct(tail, 0.5), pct(tail, 0.99));
  }
  if (trace) {
    using T = common::LoadTrace;
    std::string steps;
    for (int p = 1; p < T::kPoints; ++p) {
      if (f.step_us[p].empty()) continue;
      char one[96];
      std::snprintf(one, sizeof one, "%s%s %.2f/%.1f", steps.empty() ? "" : ", ", T::name(static_cast<T::Point>(p)),
                    pct(f.step_us[p], 0.5), pct(f.step_us[p], 0.99));
      steps += one;
    }
    std::printf("  %-22s trace, us from the step before, p50/p99: %s\n", "", steps.c_str());
    std::printf("  %-22s trace: the poller ticked p50 %.0f times a load (%.2f us a tick)\n", "", pct(f.ticks, 0.5),
                pct(f.load_us, 0.5) / std::max(1.0, pct(f.ticks, 0.5)));
    if (!f.seen_after_done_us.empty())
      std::printf("  %-22s trace: the strand saw the copies done p50 %.2f p99 %.1f us after the bench saw its own "
                  "event (recorded after them) done\n",
                  "", pct(f.seen_after_done_us, 0.5), pct(f.seen_after_done_us, 0.99));
  }
  if (!f.idle_copy_us.empty())
    std::printf("  %-22s after the same idle, without kvstrand (to the contiguous copy above): one contiguous copy "
                "p50 %6.0f us (ratio %.2f); the batch alone p50 %6.0f us (ratio %.2f)\n",
                "", pct(f.idle_copy_us, 0.5), pct(f.idle_copy_us, 0.5) / copy, pct(f.idle_batch_us, 0.5),
                pct(f.idle_batch_us, 0.5) / copy);
  std::fflush(stdout);
  return {ratio, pct(f.batch_us, 0.5) / copy, pct(f.shared_batch_us, 0.5) / copy};
}

// 16 saves in flight, each a distinct 2-chunk prompt out of the pool, for
// `seconds`; GB/s of the saves completed, against one contiguous D2H copy of
// one save's bytes (the limit the link gives a single copy).
void save_throughput(Pool& pool, const kv::Layout& l, double seconds, const char* path) {
  connector::ConnectorOptions opts;
  opts.tier_bytes = 2ull << 30;
  connector::Connector conn(opts);
  conn.register_layout(pool.registration(l));
  const std::uint64_t bytes_per_save = 32 * kBlockBytes + 2 * kImageBytes;
  std::vector<kv::BlockId> blocks(32);
  for (kv::BlockId b = 0; b < 32; ++b) blocks[b] = (b * 97) % pool.blocks;  // scattered
  std::uint64_t next = 1'000'000, done = 0;
  int in_flight = 0;
  const auto t0 = Clock::now();
  const auto stop = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  while (Clock::now() < stop || in_flight > 0) {
    while (in_flight < 16 && Clock::now() < stop) {
      auto s = save_spec(l, next++, blocks);
      conn.save(std::move(s));
      ++in_flight;
    }
    const auto f = conn.finished();
    for (const auto& o : f.saves) {
      --in_flight;
      if (!o.ok) die("save failed: " + o.reason);
      done += bytes_per_save;
    }
    if (f.saves.empty()) std::this_thread::sleep_for(20us);
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  conn.close();
  // The limit: one contiguous D2H copy of the same bytes, awaited by event.
  auto stream = must(device::Stream::create(), "stream");
  auto host = must(device::PinnedBuffer::allocate(bytes_per_save), "pinned");
  auto dev = must(device::DeviceBuffer::allocate(bytes_per_save), "device");
  auto ev = must(device::Event::create(), "event");
  std::vector<double> us;
  for (int i = 0; i < 50; ++i) {
    const auto c0 = Clock::now();
    (void)device::copy_d2h(stream, host.data(), dev.data(), bytes_per_save);
    (void)ev.record(stream);
    (void)ev.synchronize();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - c0).count());
  }
  const double got = static_cast<double>(done) / elapsed / 1e9;
  const double limit = static_cast<double>(bytes_per_save) / pct(us, 0.5) / 1e3;
  std::printf("  save throughput (%s), 16 in flight: %.1f GB/s; one contiguous D2H copy: %.1f GB/s; ratio %.2f\n",
              path, got, limit, got / limit);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 200;
  std::uint32_t pool_blocks = 4000;
  std::string clients_list = "1,2,4,8";
  double seconds = 2.0;
  bool use_server = true;
  std::string client_socket;
  int client_index = 0, raw_fd = -1;
  std::string client_path = "fastest";
  std::string load_path = "rule";  // --load-path: the in-process Connector's ConnectorOptions::load_path
  std::int64_t start_ns = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--iterations") iterations = std::max(10, std::stoi(value()));
    else if (a == "--pool-blocks") pool_blocks = static_cast<std::uint32_t>(std::max(64, std::stoi(value())));
    else if (a == "--clients") clients_list = value();
    else if (a == "--seconds") seconds = std::max(0.2, std::stod(value()));
    else if (a == "--no-server") use_server = false;
    else if (a == "--split") split = true;
    else if (a == "--trace") trace = true;
    else if (a == "--idle-spin") idle_spin = std::chrono::microseconds(std::max(0, std::stoi(value())));
    else if (a == "--idle-ms") idle_before_lookup = std::chrono::milliseconds(std::max(0, std::stoi(value())));
    else if (a == "--save-client") client_socket = value();
    else if (a == "--raw-client") raw_fd = std::stoi(value());
    else if (a == "--client-path") client_path = value();
    else if (a == "--load-path") load_path = value();
    else if (a == "--index") client_index = std::stoi(value());
    else if (a == "--start-ns") start_ns = std::stoll(value());
    else die("unknown argument " + a + " (see the file header)");
  }
  common::LoadTrace::enable(trace);
  if (auto n = device::device_count(); !n.ok() || *n == 0) die(std::string("no ") + device::backend_name() + " device");
  (void)device::select_device(0);
  if (client_path != "fastest" && client_path != "per-segment" && client_path != "dma-batch")
    die("--client-path: fastest, per-segment or dma-batch");
  if (!client_socket.empty()) {
    if (client_path == "per-segment") device::set_batch_path(device::BatchPath::per_segment);
    if (client_path == "dma-batch") device::set_batch_path(device::BatchPath::dma_batch);
    return save_client(client_socket, client_index, start_ns, seconds, idle_spin);
  }
  if (raw_fd >= 0) return raw_client(raw_fd, client_index, start_ns, seconds);

  const kv::Layout l = reference_layout();
  std::printf("bench_transfer: backend %s, pool %u blocks x 739840 B, load of 28 blocks + 1 MiB image, %d loads\n",
              device::backend_name(), pool_blocks, iterations);
  std::fflush(stdout);
  Pool pool(pool_blocks);
  LoadRatios embedded, served, plain, dma, kernel;
  {
    connector::ConnectorOptions opts;
    opts.tier_bytes = 64ull << 20;
    opts.reactor_idle_spin = idle_spin;
    opts.load_path = load_path;  // measure: the paths timed at its registration
    connector::Connector conn(opts);
    conn.register_layout(pool.registration(l));
    device::set_batch_path(device::BatchPath::per_segment);
    plain = report("embedded, 1 copy/seg", measure_loads(conn, pool, l, iterations));
    device::set_batch_path(device::BatchPath::dma_batch);
    dma = report("embedded, DMA batch", measure_loads(conn, pool, l, iterations));
    device::set_batch_path(device::BatchPath::kernel);
    kernel = report("embedded, kernel", measure_loads(conn, pool, l, iterations));
    device::set_batch_path(device::BatchPath::fastest);
    embedded = report("embedded", measure_loads(conn, pool, l, iterations));
    conn.close();
  }
  const device::LoadPaths* chosen = device::load_paths();
  const std::string chosen_path =
      chosen ? device::to_string(chosen->path_for(kBlockBytes / 5)) : std::string("the built-in rule");
  std::printf("  (the embedded tier batches by: %s; DMA batch: one cudaMemcpyBatchAsync a batch where the backend has it, "
              "else one copy a segment; kernel: the gather kernel where the backend has it; loads' path %s)\n",
              device::fastest_batch_path(), chosen ? chosen->describe().c_str() : "not measured (one path here)");
  device::set_batch_path(device::BatchPath::dma_batch);
  save_throughput(pool, l, seconds, "DMA batch");
  device::set_batch_path(device::BatchPath::fastest);
  save_throughput(pool, l, seconds, device::fastest_batch_path());
  if (!use_server) {
    std::printf("load latency ratio to one contiguous copy: embedded %.2f by %s (one copy a segment: %.2f, DMA batch: "
                "%.2f, kernel: %.2f); the batch alone %.2f (from shared 4 KiB pages %.2f)\n",
                embedded.load, chosen_path.c_str(), plain.load, dma.load, kernel.load, embedded.batch_alone,
                embedded.shared_batch);
    return 0;
  }
  const std::string binary = self_dir() + "/../kvstrand-server";
  if (!std::filesystem::exists(binary)) die(binary + " not built (or pass --no-server)");
  Server server(binary);
  {
    // The same --load-path as the embedded tier's (a Connector's choice is
    // process-wide: a default one here put the node tier on the built-in rule).
    auto conn = connect_when_up(server.socket, pool, l, idle_spin, load_path);
    served = report("node tier (kvstrand-server)", measure_loads(*conn, pool, l, iterations));
    conn->close();
  }
  std::printf("  save scaling, %.1f s window, 2 saves in flight per client, 25.8 MB each, clients' batch path %s; "
              "raw: one contiguous D2H copy per save into one shared pinned arena, the same run:\n",
              seconds, client_path == "fastest"     ? device::fastest_batch_path()
                        : client_path == "dma-batch" ? "one batched DMA call a batch"
                                                     : "one copy a segment");
  std::vector<int> counts;
  std::stringstream list(clients_list);
  for (std::string item; std::getline(list, item, ',');) counts.push_back(std::max(1, std::stoi(item)));
  // Inherited by the raw clients (no CLOEXEC): two save slots per client.
  const int arena_fd = ::memfd_create("bench_transfer-raw", 0);
  const std::uint64_t slot = 32 * kBlockBytes + 2 * kImageBytes;
  const std::uint64_t arena_bytes = 2 * slot * static_cast<std::uint64_t>(*std::max_element(counts.begin(), counts.end()));
  if (arena_fd < 0 || ::ftruncate(arena_fd, static_cast<off_t>(arena_bytes)) != 0)
    die("cannot make the raw clients' shared arena");
  double one = 0, one_raw = 0;
  for (const int n : counts) {
    const double kv = save_scaling(server.socket, n, seconds, client_path);
    const double raw = save_scaling("", n, seconds, client_path, arena_fd);
    if (n == counts.front()) one = kv, one_raw = raw;
    std::printf("    %d client process%s: %6.2f GB/s aggregate (%.2f of %d), raw %6.2f GB/s (%.2f of %d)\n", n,
                n == 1 ? "" : "es", kv, kv / one, counts.front(), raw, raw / one_raw, counts.front());
    std::fflush(stdout);
  }
  ::close(arena_fd);
  std::printf("load latency ratio to one contiguous copy: embedded %.2f by %s (one copy a segment: %.2f, DMA batch: "
              "%.2f, kernel: %.2f), node %.2f (node/embedded %.3f); the batch alone %.2f (from shared 4 KiB pages "
              "%.2f: shared/pinned %.3f)\n",
              embedded.load, chosen_path.c_str(), plain.load, dma.load, kernel.load, served.load,
              served.load / embedded.load, embedded.batch_alone, embedded.shared_batch,
              embedded.shared_batch / embedded.batch_alone);
  return 0;
}
