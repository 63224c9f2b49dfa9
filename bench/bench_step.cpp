// Step-thread cost of kvstrand in an engine-like loop.
//
// 16 requests run concurrently. Every step, each request may post a save of
// its next chunk or a load of a chunk it saved earlier (never two of a kind
// live at once); the step posts them in one batch with submit(), then drains
// finished(). Between steps the thread sleeps 200 us, standing in for the
// engine waiting on its forward pass. Timed: the step's own work, excluding
// that sleep. The same loop with the kvstrand calls replaced by nothing runs
// first, in the same process, as the baseline; then kvstrand; then kvstrand
// with its HTTP debug endpoint on and scraped (/metrics and /debug/transfers)
// every 250 ms by another thread. Last six lines:
//   baseline p50 X p99 Y
//   step-thread us per step: p50 X p99 Y   (and the difference to baseline)
//   with the debug endpoint scraped: p50 X p99 Y (ratio to without: ...)
//   baseline with the copies: p50 X p99 Y; kvstrand above it: ...
//   the handoff floor, the spec read in place: ...; kvstrand above it: ...
//   the handoff floor, a compact record: ...; kvstrand above it: ...
//
// The arms take turns: every arm is made once, then the run is cut into
// rounds (--rounds, default 5) and each round gives every arm its share of
// the steps in turn; between its turns an arm's helper threads rest (no
// spinning, no scraping). A host whose speed drifts over seconds (the lent
// H200 hosts' baseline moved 4.0-6.4 us between arms run one after
// another) then shifts every arm alike, not one arm against another. Each
// round prints its own difference to the baseline, so drift stays visible.
//
// Each arm also prints the p50 of the engine's own work in the step (its
// planning before submit()): the same code in every arm, so what it gains
// in the kvstrand arms is what kvstrand's threads cost it (caches, memory
// bandwidth, a shared core) rather than its calls.
//
// A fourth arm tells those apart: the baseline loop again, with a thread of
// its own (not kvstrand) copying each op's bytes the way its transfer
// would (device to host for a save, host to device for a load, between the
// op's blocks and a host area the tier's size). The step thread only bumps
// a counter. What the
// engine's work gains there is what moving those bytes costs it on this
// machine, with no kvstrand code at all: the floor under the kvstrand arms.
//
// Two more arms put a floor under the kvstrand arms (handoff_floor.hpp):
// the baseline loop handing each op to a polling thread of its own and
// taking its end back through two lock-free rings, nothing else; that
// thread reads either the engine's spec in place or a compact record the
// step thread fills. What kvstrand costs above them is its own work and
// the lines its own memory moves between the cores.
//
// Each arm prints how often the step thread woke on another CPU than the
// step before (on the machines measured, in at most 0.1 % of steps with the
// reactor polling: what kvstrand costs the engine's code is not a
// migration). With --pin CPU the step thread runs on
// that CPU only, in every arm; kvstrand's threads are left where the
// scheduler puts them, or, with --kv-cpu CPU, kept on that one.
//
// usage: bench_step [steps] [--rounds N] [--idle-spin US] [--pin CPU] [--kv-cpu CPU]
//        (default 10000 steps an arm over 5 rounds; the reactor's idle spin,
//        ConnectorOptions::reactor_idle_spin, default 2000; no pinning)
#include <arpa/inet.h>
#include <pthread.h>
#include <sched.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "device/device.hpp"
#include "device/copy.hpp"
#include "device/device_buffer.hpp"
#include "device/event.hpp"
#include "device/pinned_buffer.hpp"
#include "device/stream.hpp"
#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/namespace_id.hpp>
#include "connector/connector.hpp"
#include "handoff_floor.hpp"
#include "percentile.hpp"
#include "rest_switch.hpp"

using namespace kvstrand;
using kvstrand::bench::pct;
using kvstrand::bench::RestSwitch;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRequests = 16;
constexpr std::uint32_t kBlocksPerRequest = 32;  // two chunks of 16 blocks
constexpr std::uint64_t kPlaneBlockBytes = 4096;
constexpr std::size_t kTierBytes = 256ull << 20;  // the kvstrand arms' tier; the copies arm's host area

struct Engine {
  kv::Layout layout;
  kv::Digest ns{};
  std::vector<std::vector<kv::ChunkKey>> keys;  // per request: its two chunks
  struct Req {
    bool save_live = false, load_live = false;
    int saved = 0;  // chunks saved so far (0..2)
  };
  std::vector<Req> reqs = std::vector<Req>(kRequests);
  std::mt19937 rng{7};

  Engine() {
    layout.model_id = "bench";
    layout.layout_name = "bench";
    for (int p = 0; p < 5; ++p) layout.planes.push_back({"p" + std::to_string(p), kPlaneBlockBytes});
    layout.dtype = "bf16";
    ns = kv::namespace_of(layout);
    for (int r = 0; r < kRequests; ++r) {
      std::vector<std::uint32_t> toks(512);
      for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint32_t>(r * 100003 + i);
      keys.push_back(kv::chunk_keys(layout, ns, toks));
    }
  }

  // The ops this step would post (built in both arms).
  std::vector<connector::Connector::Op> plan_step() {
    std::vector<connector::Connector::Op> ops;
    for (int r = 0; r < kRequests; ++r) {
      Req& q = reqs[r];
      const std::uint32_t base = static_cast<std::uint32_t>(r) * kBlocksPerRequest;
      if (!q.save_live && (rng() % 4 == 0)) {
        const int c = q.saved % 2;
        kv::TransferSpec s;
        s.request = "r" + std::to_string(r);
        s.tokens = {static_cast<std::uint32_t>(c) * 256, static_cast<std::uint32_t>(c + 1) * 256};
        s.keys = {keys[r][c]};
        for (std::uint32_t b = 0; b < 16; ++b) s.blocks.push_back(base + c * 16 + b);
        ops.push_back({kvstrand::TransferKind::save, std::move(s), nullptr});
        q.save_live = true;
      } else if (!q.load_live && q.saved > 0 && (rng() % 4 == 0)) {
        kv::TransferSpec s;
        s.request = "r" + std::to_string(r);
        s.tokens = {0, 256};
        s.keys = {keys[r][0]};
        for (std::uint32_t b = 0; b < 16; ++b) s.blocks.push_back(kRequests * kBlocksPerRequest + static_cast<std::uint32_t>(r) * 16 + b);
        ops.push_back({kvstrand::TransferKind::load, std::move(s), nullptr});
        q.load_live = true;
      }
    }
    return ops;
  }

  void settle(const kvstrand::Finished& f) {
    for (const auto& o : f.saves) {
      Req& q = reqs[std::stoi(o.request.substr(1))];
      q.save_live = false;
      if (o.ok) ++q.saved;
    }
    for (const auto& o : f.loads) reqs[std::stoi(o.request.substr(1))].load_live = false;
  }
};

// The copies arm's copier: moves each op's bytes as its transfer would,
// between the op's own blocks of every plane (16 consecutive blocks a
// plane: one copy a plane) and the next 320 KiB of a pinned host area as
// large as the kvstrand arms' tier (a ring), so the caches see the same
// addresses and footprint; in the order the step thread counted the ops,
// saying how many it has finished. Between looks it sleeps 50 us, so the
// step thread never waits on it and it never spins. The step thread only
// stores the op's kind and first block and bumps a counter.
class Copier {
 public:
  Copier(std::size_t max_ops, std::vector<std::byte*> planes, std::size_t host_bytes)
      : stream_(device::Stream::create().value()),
        event_(device::Event::create().value()),
        host_(device::PinnedBuffer::allocate(host_bytes).value()),
        planes_(std::move(planes)),
        ops_(max_ops),
        thread_([this] { loop(); }) {}
  ~Copier() { stop(); }
  void stop() {
    stop_ = true;
    rest(false);
    if (thread_.joinable()) thread_.join();
  }
  void post(bool save, std::uint32_t first_block) {
    const std::size_t n = posted_.load(std::memory_order_relaxed);
    ops_[n] = {save, first_block};
    posted_.store(n + 1, std::memory_order_release);
  }
  std::size_t done() const { return done_.load(std::memory_order_acquire); }
  // Between its arm's turns, once it has moved what was posted, it blocks.
  void rest(bool on) { resting_.set(on); }

 private:
  static constexpr std::size_t kPlaneBytes = 16 * kPlaneBlockBytes;  // one op's blocks of one plane

  void loop() {
    std::size_t done = 0, at = 0;
    while (!stop_) {
      const std::size_t posted = posted_.load(std::memory_order_acquire);
      if (posted == done) {
        resting_.wait();
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
      for (; done < posted; ++done)
        for (std::byte* plane : planes_) {
          if (at + kPlaneBytes > host_.size()) at = 0;
          std::byte* dev = plane + ops_[done].first_block * kPlaneBlockBytes;
          (void)(ops_[done].save ? device::copy_d2h(stream_, host_.data() + at, dev, kPlaneBytes)
                                 : device::copy_h2d(stream_, dev, host_.data() + at, kPlaneBytes));
          at += kPlaneBytes;
        }
      (void)event_.record(stream_);
      (void)event_.synchronize();
      done_.store(done, std::memory_order_release);
    }
  }

  struct PostedOp {
    bool save = false;
    std::uint32_t first_block = 0;
  };
  device::Stream stream_;
  device::Event event_;
  device::PinnedBuffer host_;
  std::vector<std::byte*> planes_;
  std::vector<PostedOp> ops_;  // in posting order
  std::atomic<std::size_t> posted_{0}, done_{0};
  std::atomic<bool> stop_{false};
  RestSwitch resting_;
  std::thread thread_;
};

// One HTTP GET over a fresh connection; the response is read and dropped.
void scrape(std::uint16_t port, const char* path) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = std::string("GET ") + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    (void)::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
    char buf[4096];
    while (::recv(fd, buf, sizeof buf, 0) > 0) {
    }
  }
  ::close(fd);
}

// Runs `make` with this thread allowed every CPU (or only `cpu`, when not
// negative), then restores its own mask: threads it starts inherit the
// mask they were made with.
template <class Make>
auto on_cpus(int cpu, Make make) {
  cpu_set_t mine, mask;
  pthread_getaffinity_np(pthread_self(), sizeof mine, &mine);
  CPU_ZERO(&mask);
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (cpu < 0 || c == cpu) CPU_SET(c, &mask);
  pthread_setaffinity_np(pthread_self(), sizeof mask, &mask);
  auto made = make();
  pthread_setaffinity_np(pthread_self(), sizeof mine, &mine);
  return made;
}

// One arm's figures, gathered over its turns.
struct Samples {
  std::vector<double> us, submit_us, finished_us, plan_us;  // per step
  std::size_t posted = 0, completed = 0, moved = 0;
};

// One arm: its engine and what stands in for kvstrand's part (nothing,
// kvstrand itself, the copier, a handoff floor), made once and kept over
// the rounds; it steps only in its turns.
class Arm {
 public:
  enum class Kind { baseline, kvstrand, kvstrand_http, copies, floor_in_place, floor_compact };
  struct Setup {
    std::vector<std::byte*> planes;
    std::uint32_t pool_blocks = 0;
    std::chrono::microseconds idle_spin{};
    int kv_cpu = -1;
    std::size_t max_ops = 0;  // over the whole run: the copier's op list
  };

  Arm(Kind kind, const Setup& setup) {
    using Reads = bench::HandoffFloor::Reads;
    if (kind == Kind::floor_in_place || kind == Kind::floor_compact)
      on_cpus(setup.kv_cpu, [&] {
        handoff_.emplace(64, kind == Kind::floor_compact ? Reads::compact : Reads::in_place);  // 16 requests, a save and a load each
        return 0;
      });
    if (kind == Kind::copies)
      on_cpus(setup.kv_cpu, [&] {
        copier_.emplace(setup.max_ops, setup.planes, kTierBytes);
        return 0;
      });
    if (kind == Kind::kvstrand || kind == Kind::kvstrand_http) {
      connector::ConnectorOptions opts;
      opts.tier_bytes = kTierBytes;
      opts.reactor_idle_spin = setup.idle_spin;
      if (kind == Kind::kvstrand_http) opts.http = common::HttpOptions{};
      conn_ = on_cpus(setup.kv_cpu, [&] { return std::make_unique<connector::Connector>(opts); });
      if (kind == Kind::kvstrand_http)
        scraper_ = std::thread([this, port = conn_->http_port()] {
          while (!done_) {
            if (!resting_) {
              scrape(port, "/metrics");
              scrape(port, "/debug/transfers");
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(250));
          }
        });
      kvstrand::Registration reg;
      reg.layout = engine_.layout;
      for (std::byte* p : setup.planes) reg.planes.push_back({p, setup.pool_blocks});
      conn_->register_layout(reg);
    }
    rest();
  }
  ~Arm() { stop(); }
  Arm(const Arm&) = delete;
  Arm& operator=(const Arm&) = delete;

  void stop() {
    done_ = true;
    if (scraper_.joinable()) scraper_.join();
    if (conn_) conn_->close();
    if (copier_) copier_->stop();
    if (handoff_) handoff_->stop();
  }

  // `n` steps, each timed, its figures added to samples.
  void turn(int n) {
    resting_ = false;
    if (handoff_) handoff_->rest(false);
    if (copier_) copier_->rest(false);
    int cpu = sched_getcpu();
    for (int step = 0; step < n; ++step) {
      if (const int now = sched_getcpu(); now != cpu) {  // before the clock: not timed
        ++s_.moved;
        cpu = now;
      }
      one_step();
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // the forward pass
    }
    rest();
  }

  const Samples& samples() const { return s_; }

 private:
  // Between turns its helper threads neither spin nor scrape (kvstrand's
  // reactor stops spinning by itself once idle for its idle spin).
  void rest() {
    resting_ = true;
    if (handoff_) handoff_->rest(true);
    if (copier_) copier_->rest(true);
  }

  void one_step() {
    const auto t0 = Clock::now();
    auto ops = engine_.plan_step();
    s_.plan_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    s_.posted += ops.size();
    if (conn_) {
      const auto s0 = Clock::now();
      if (!ops.empty()) conn_->submit(std::move(ops));
      const auto s1 = Clock::now();
      auto f = conn_->finished();
      s_.submit_us.push_back(std::chrono::duration<double, std::micro>(s1 - s0).count());
      s_.finished_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - s1).count());
      s_.completed += f.saves.size() + f.loads.size();
      engine_.settle(f);
    } else if (handoff_) {
      // The floor arms: each op handed to the other thread and back.
      for (auto& op : ops) handoff_->post(op.kind == kvstrand::TransferKind::save, std::move(op.spec));
      kvstrand::Finished f;
      handoff_->drain([&](bool save, kv::TransferSpec& spec) {
        kvstrand::TransferOutcome o;
        o.request = spec.request;
        o.kind = save ? kvstrand::TransferKind::save : kvstrand::TransferKind::load;
        o.ok = true;
        if (o.kind == kvstrand::TransferKind::save) o.blocks = std::move(spec.blocks);
        (o.kind == kvstrand::TransferKind::save ? f.saves : f.loads).push_back(std::move(o));
      });
      s_.completed += f.saves.size() + f.loads.size();
      engine_.settle(f);
    } else if (copier_) {
      // The copies arm: an op completes when the copier has moved its bytes.
      for (auto& op : ops) {
        kvstrand::TransferOutcome o;
        o.request = op.spec.request;
        o.kind = op.kind;
        o.ok = true;
        copying_.push_back(std::move(o));
        copier_->post(op.kind == kvstrand::TransferKind::save, op.spec.blocks.front());
      }
      kvstrand::Finished f;
      for (const std::size_t done = copier_->done(); s_.completed < done; ++s_.completed) {
        (copying_.front().kind == kvstrand::TransferKind::save ? f.saves : f.loads)
            .push_back(std::move(copying_.front()));
        copying_.pop_front();
      }
      engine_.settle(f);
    } else {
      // Baseline: everything posted completes at once, with no kvstrand call.
      kvstrand::Finished f;
      for (auto& op : ops) {
        kvstrand::TransferOutcome o;
        o.request = op.spec.request;
        o.kind = op.kind;
        o.ok = true;
        (op.kind == kvstrand::TransferKind::save ? f.saves : f.loads).push_back(std::move(o));
      }
      s_.completed += ops.size();
      engine_.settle(f);
    }
    s_.us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }

  Engine engine_;
  std::unique_ptr<connector::Connector> conn_;
  std::optional<Copier> copier_;
  std::deque<kvstrand::TransferOutcome> copying_;  // posted to the copier, in order
  std::optional<bench::HandoffFloor> handoff_;
  std::atomic<bool> done_{false}, resting_{false};
  std::thread scraper_;
  Samples s_;
};

}  // namespace

int main(int argc, char** argv) {
  int steps = 10000;
  int rounds = 5;
  std::chrono::microseconds idle_spin = kvstrand::ConnectorOptions{}.reactor_idle_spin;
  int pin = -1, kv_cpu = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--idle-spin" && i + 1 < argc)
      idle_spin = std::chrono::microseconds(std::atol(argv[++i]));
    else if (a == "--pin" && i + 1 < argc)
      pin = std::atoi(argv[++i]);
    else if (a == "--kv-cpu" && i + 1 < argc)
      kv_cpu = std::atoi(argv[++i]);
    else if (a == "--rounds" && i + 1 < argc)
      rounds = std::max(1, std::atoi(argv[++i]));
    else
      steps = std::max(100, std::atoi(argv[i]));
  }
  if (auto n = device::device_count(); !n.ok() || *n == 0) {
    std::fprintf(stderr, "bench_step: no %s device\n", device::backend_name());
    return 1;
  }
  (void)device::select_device(0);
  if (pin >= 0) {
    // After the device's own threads exist, so they keep every CPU; each
    // arm's kvstrand threads are made by this thread and would inherit the
    // pin, so it is undone around their creation (run()).
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(pin, &one);
    if (pthread_setaffinity_np(pthread_self(), sizeof one, &one) != 0) {
      std::fprintf(stderr, "bench_step: cannot pin to CPU %d\n", pin);
      return 1;
    }
  }
  const std::uint32_t pool_blocks = kRequests * kBlocksPerRequest + 16 * 16;
  std::vector<device::DeviceBuffer> planes;
  for (int p = 0; p < 5; ++p) planes.push_back(device::DeviceBuffer::allocate(pool_blocks * kPlaneBlockBytes).value());

  std::printf("bench_step: backend %s, %d requests, %d steps an arm in %d rounds, 200 us forward pass between steps, "
              "reactor idle spin %lld us, step thread %s\n",
              device::backend_name(), kRequests, steps, rounds, static_cast<long long>(idle_spin.count()),
              pin >= 0 ? ("pinned to CPU " + std::to_string(pin)).c_str() : "not pinned");
  if (kv_cpu >= 0) std::printf("kvstrand's threads (and the copies arm's copier) on CPU %d only\n", kv_cpu);
  Arm::Setup setup;
  for (auto& p : planes) setup.planes.push_back(p.data());
  setup.pool_blocks = pool_blocks;
  setup.idle_spin = idle_spin;
  setup.kv_cpu = kv_cpu;
  setup.max_ops = static_cast<std::size_t>(steps) * kRequests;
  Arm base_a(Arm::Kind::baseline, setup), kvs_a(Arm::Kind::kvstrand, setup), web_a(Arm::Kind::kvstrand_http, setup),
      copies_a(Arm::Kind::copies, setup), in_place_a(Arm::Kind::floor_in_place, setup),
      compact_a(Arm::Kind::floor_compact, setup);
  // The p50 of the steps `arm` took since it had `from`: one turn's.
  auto turn_p50 = [](const Arm& arm, std::size_t from) {
    const auto& us = arm.samples().us;
    return pct(std::vector<double>(us.begin() + static_cast<std::ptrdiff_t>(from), us.end()), 0.5);
  };
  for (int r = 0; r < rounds; ++r) {
    const int n = steps / rounds + (r < steps % rounds ? 1 : 0);
    const std::size_t from = base_a.samples().us.size();
    for (Arm* arm : {&base_a, &kvs_a, &web_a, &copies_a, &in_place_a, &compact_a}) {
      arm->turn(n);
      // What the last turn left running (transfers ending, a reactor's idle
      // spin) settles before the next arm's turn.
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    const double b = turn_p50(base_a, from);
    std::printf("  round %d of %d, %d steps an arm: baseline p50 %.2f us; above it: kvstrand %.2f, the handoff floor "
                "(compact) %.2f\n",
                r + 1, rounds, n, b, turn_p50(kvs_a, from) - b, turn_p50(compact_a, from) - b);
    std::fflush(stdout);
  }
  for (Arm* arm : {&base_a, &kvs_a, &web_a, &copies_a, &in_place_a, &compact_a}) arm->stop();
  auto report = [&](const Samples& s, const char* what, bool kvstrand) {
    std::printf("  %s: %zu transfers posted, %zu completed\n", what, s.posted, s.completed);
    std::printf("    the engine's own planning p50 %.2f us; the step thread woke on another CPU in %.1f %% of steps\n",
                pct(s.plan_us, 0.5), 100.0 * static_cast<double>(s.moved) / static_cast<double>(s.us.size()));
    if (kvstrand)  // where the step's kvstrand time goes
      std::printf("    of which submit() p50 %.2f p99 %.2f us, finished() p50 %.2f p99 %.2f us\n", pct(s.submit_us, 0.5),
                  pct(s.submit_us, 0.99), pct(s.finished_us, 0.5), pct(s.finished_us, 0.99));
  };
  report(base_a.samples(), "baseline", false);
  report(kvs_a.samples(), "kvstrand", true);
  report(web_a.samples(), "kvstrand + debug endpoint", true);
  report(copies_a.samples(), "baseline with the copies", false);
  report(in_place_a.samples(), "the handoff floor, the spec in place", false);
  report(compact_a.samples(), "the handoff floor, a compact record", false);
  const auto& base = base_a.samples().us;
  const auto& kvs = kvs_a.samples().us;
  const auto& web = web_a.samples().us;
  const auto& copies = copies_a.samples().us;
  const auto& in_place = in_place_a.samples().us;
  const auto& compact = compact_a.samples().us;
  std::printf("baseline p50 %.2f p99 %.2f\n", pct(base, 0.5), pct(base, 0.99));
  std::printf("step-thread us per step: p50 %.2f p99 %.2f (above baseline: p50 %.2f p99 %.2f)\n", pct(kvs, 0.5),
              pct(kvs, 0.99), pct(kvs, 0.5) - pct(base, 0.5), pct(kvs, 0.99) - pct(base, 0.99));
  std::printf("with the debug endpoint scraped every 250 ms: p50 %.2f p99 %.2f (ratio to without: p50 %.3f, p99 %.3f)\n",
              pct(web, 0.5), pct(web, 0.99), pct(web, 0.5) / pct(kvs, 0.5), pct(web, 0.99) / pct(kvs, 0.99));
  std::printf("baseline with the copies (a thread of its own moves each step's bytes): p50 %.2f p99 %.2f; "
              "kvstrand above it: p50 %.2f p99 %.2f\n",
              pct(copies, 0.5), pct(copies, 0.99), pct(kvs, 0.5) - pct(copies, 0.5), pct(kvs, 0.99) - pct(copies, 0.99));
  for (const auto& [floor_us, what] : {std::pair{&in_place, "the spec read in place"}, std::pair{&compact, "a compact record"}})
    std::printf("the handoff floor, %s (each op to a polling thread of its own and back, nothing else): p50 %.2f "
                "p99 %.2f (above baseline: p50 %.2f p99 %.2f); kvstrand above it: p50 %.2f p99 %.2f\n",
                what, pct(*floor_us, 0.5), pct(*floor_us, 0.99), pct(*floor_us, 0.5) - pct(base, 0.5),
                pct(*floor_us, 0.99) - pct(base, 0.99), pct(kvs, 0.5) - pct(*floor_us, 0.5),
                pct(kvs, 0.99) - pct(*floor_us, 0.99));
  return 0;
}
