// The library an engine links (libkvstrand.so) through its public headers
// only: this test links nothing else. The sim hooks it uses to hold a
// stream are kvstrand symbols the library exports.
#include <catch2/catch.hpp>

#include <kvstrand/kvstrand.hpp>

#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>


using namespace kvstrand;
using namespace std::chrono_literals;

namespace {

constexpr std::uint32_t kBlocks = 32;
constexpr std::uint64_t kBlockBytes = 4096;

bool sim_backend() { return sim::available(); }

std::vector<std::byte> pattern(std::size_t n, unsigned seed) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 7) & 0xff);
  return v;
}

// One stateless group of 16-token blocks, 64-token chunks, in DeviceMemory.
struct Engine {
  kv::Layout layout;
  DeviceMemory plane = DeviceMemory::allocate(kBlocks * kBlockBytes);
  DeviceStream stream = DeviceStream::create();
  Connector conn;
  std::uint32_t group = 0;

  explicit Engine(ConnectorOptions o = small()) : conn(o) {
    layout.model_id = "public-api";
    layout.layout_name = "public-api";
    layout.planes = {{"kv", kBlockBytes}};
    layout.block_tokens = 16;
    layout.chunk_tokens = 64;
    layout.dtype = "bf16";
    Registration reg;
    reg.layout = layout;
    reg.planes = {{plane.data(), kBlocks}};
    group = conn.register_layout(reg);
  }
  static ConnectorOptions small() {
    ConnectorOptions o;
    o.tier_bytes = 8u << 20;
    o.transfer_deadline = 20s;
    return o;
  }
  kv::TransferSpec spec(const std::string& req, std::uint32_t first_block) {
    std::vector<std::uint32_t> toks(128);
    for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint32_t>(i * 3 + 1);
    kv::TransferSpec s;
    s.request = req;
    s.registration = group;
    s.tokens = {0, 128};
    s.keys = kv::chunk_keys(layout, kv::namespace_of(layout), toks);
    for (std::uint32_t b = 0; b < 8; ++b) s.blocks.push_back(first_block + b);
    return s;
  }
  Finished wait(std::size_t saves, std::size_t loads, std::size_t lookups = 0) {
    Finished all;
    const auto end = std::chrono::steady_clock::now() + 10s;
    while (all.saves.size() < saves || all.loads.size() < loads || all.lookups.size() < lookups) {
      if (std::chrono::steady_clock::now() > end) FAIL("timed out");
      Finished f = conn.finished();
      all.saves.insert(all.saves.end(), f.saves.begin(), f.saves.end());
      all.loads.insert(all.loads.end(), f.loads.begin(), f.loads.end());
      all.lookups.insert(all.lookups.end(), f.lookups.begin(), f.lookups.end());
      std::this_thread::sleep_for(200us);
    }
    return all;
  }
  std::vector<std::byte> blocks(std::uint32_t first, std::uint32_t n) {
    std::vector<std::byte> v(n * kBlockBytes);
    plane.read(first * kBlockBytes, v);
    return v;
  }
};

// The smallest coroutine type: starts at once, nothing returned.
struct Task {
  struct promise_type {
    Task get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { std::terminate(); }
  };
};

// An engine's step as a coroutine (a function, not a lambda: GCC 12, docs/development.md).
Task fence_step(Engine& e, Connector::Resume resume, bool& fenced, std::thread::id& resumed_on) {
  e.conn.save(e.spec("r", 0));
  std::vector<std::string> requests{"r"};
  co_await e.conn.fenced(std::move(requests), 10s, std::move(resume));
  fenced = true;
  resumed_on = std::this_thread::get_id();
}

}  // namespace

TEST_CASE("public api: the version and backend the library reports", "[api]") {
  REQUIRE(std::string(version()) == KVSTRAND_VERSION_STRING);
  const std::string b = backend();
  REQUIRE((b == "sim" || b == "hip" || b == "cuda"));
}

TEST_CASE("public api: a save waits for the engine's own stream (Producer::after_stream), a load restores it",
          "[api][sim]") {
  if (!sim_backend()) return;
  Engine e;
  e.plane.write(0, pattern(8 * kBlockBytes, 1));  // what the blocks held before this step
  // The step's forward pass, on the engine's stream: held, so it has not run.
  sim::hold_stream(e.stream.native());
  const auto step = pattern(8 * kBlockBytes, 2);
  e.plane.write_async(0, step, e.stream);
  e.conn.save(e.spec("r", 0), Producer::after_stream(e.stream.native()));
  std::this_thread::sleep_for(50ms);
  REQUIRE(e.conn.finished().saves.empty());  // waiting for the forward pass
  sim::release_stream(e.stream.native());
  auto f = e.wait(1, 0);
  INFO(f.saves[0].reason);
  REQUIRE(f.saves[0].ok);
  const auto id = e.conn.lookup(e.spec("r", 0).keys, e.group);
  f = e.wait(0, 0, 1);
  REQUIRE(f.lookups[0].id == id);
  REQUIRE(f.lookups[0].hit.tokens == 128);
  e.conn.load(e.spec("r", 16));
  f = e.wait(0, 1);
  REQUIRE(f.loads[0].ok);
  REQUIRE(e.blocks(16, 8) == step);  // the step's bytes, not the ones before it
}

TEST_CASE("public api: an engine's own event is waited for (Producer::after_event)", "[api][sim]") {
  if (!sim_backend()) return;
  Engine e;
  DeviceEvent ev = DeviceEvent::create();
  sim::hold_stream(e.stream.native());
  const auto step = pattern(8 * kBlockBytes, 3);
  e.plane.write_async(0, step, e.stream);
  ev.record(e.stream);
  e.conn.save(e.spec("r", 0), Producer::after_event(ev.native()));
  std::this_thread::sleep_for(50ms);
  REQUIRE(e.conn.finished().saves.empty());
  sim::release_stream(e.stream.native());
  REQUIRE(e.wait(1, 0).saves[0].ok);
  e.conn.load(e.spec("r", 16));
  REQUIRE(e.wait(0, 1).loads[0].ok);
  REQUIRE(e.blocks(16, 8) == step);
  REQUIRE_THROWS_AS(e.conn.save(e.spec("s", 0), Producer::after_event(0)), TransferRefused);
}

TEST_CASE("public api: queued copies through HostMemory, device to device, and an event waited for", "[api][sim]") {
  if (!sim_backend()) return;
  DeviceMemory mem = DeviceMemory::allocate(4 * kBlockBytes);
  DeviceStream stream = DeviceStream::create();
  HostMemory host = HostMemory::allocate(2 * kBlockBytes);
  REQUIRE(host.size() == 2 * kBlockBytes);
  const auto bytes = pattern(kBlockBytes, 5);
  std::memcpy(host.data(), bytes.data(), kBlockBytes);
  DeviceEvent done = DeviceEvent::create();
  sim::hold_stream(stream.native());
  mem.write_async(0, {host.data(), kBlockBytes}, stream);
  mem.copy_async(2 * kBlockBytes, mem, 0, kBlockBytes, stream);  // after the write, on the same stream
  mem.read_async(2 * kBlockBytes, {host.data() + kBlockBytes, kBlockBytes}, stream);
  done.record(stream);
  std::this_thread::sleep_for(20ms);
  REQUIRE(std::memcmp(host.data() + kBlockBytes, bytes.data(), kBlockBytes) != 0);  // held: nothing ran yet
  sim::release_stream(stream.native());
  done.synchronize();
  REQUIRE(std::memcmp(host.data() + kBlockBytes, bytes.data(), kBlockBytes) == 0);
  REQUIRE_THROWS_AS(mem.copy_async(3 * kBlockBytes, mem, 0, 2 * kBlockBytes, stream), std::out_of_range);
  REQUIRE_THROWS_AS(mem.read_async(4 * kBlockBytes, {host.data(), 1}, stream), std::out_of_range);
}

TEST_CASE("public api: a test of an engine holds or fails its Connector's loads (sim::load_stream)", "[api][sim][fault]") {
  if (!sim_backend()) return;
  Engine e;
  e.plane.write(0, pattern(8 * kBlockBytes, 6));
  e.conn.save(e.spec("r", 0));
  REQUIRE(e.wait(1, 0).saves[0].ok);
  const NativeStream loads = sim::load_stream(e.conn);
  REQUIRE(loads != 0);
  // Held: the load cannot end; released: it lands.
  sim::hold_stream(loads);
  e.conn.load(e.spec("a", 16));
  std::this_thread::sleep_for(50ms);
  REQUIRE(e.conn.finished().loads.empty());
  sim::release_stream(loads);
  REQUIRE(e.wait(0, 1).loads[0].ok);
  // Failed where it runs: the load fails with the injected cause.
  sim::fail_copies(loads, 1);
  e.conn.load(e.spec("b", 16));
  const auto f = e.wait(0, 1);
  INFO(f.loads[0].reason);
  REQUIRE_FALSE(f.loads[0].ok);
  REQUIRE(f.loads[0].reason.find("injected") != std::string::npos);
  e.conn.close();
  REQUIRE_THROWS_AS(sim::load_stream(e.conn), std::runtime_error);
}

TEST_CASE("public api: one submit's ops after the same stream wait for one point of it", "[api][sim]") {
  if (!sim_backend()) return;
  Engine e;
  sim::hold_stream(e.stream.native());
  const auto step = pattern(16 * kBlockBytes, 7);
  e.plane.write_async(0, step, e.stream);
  std::vector<Op> ops;
  ops.push_back({TransferKind::save, e.spec("r", 0), Producer::after_stream(e.stream.native())});
  ops.push_back({TransferKind::save, e.spec("s", 8), Producer::after_stream(e.stream.native())});
  ops[1].spec.keys = kv::chunk_keys(e.layout, kv::namespace_of(e.layout), std::vector<std::uint32_t>(128, 9));
  e.conn.submit(std::move(ops));
  std::this_thread::sleep_for(50ms);
  REQUIRE(e.conn.finished().saves.empty());  // both wait for the held forward pass
  sim::release_stream(e.stream.native());
  const auto f = e.wait(2, 0);
  REQUIRE(f.saves[0].ok);
  REQUIRE(f.saves[1].ok);
}

TEST_CASE("public api: refusals are caught by their own types across the library", "[api]") {
  Engine e;
  kv::TransferSpec s = e.spec("r", 0);
  s.registration = 3;
  try {
    e.conn.save(s);
    FAIL("a save naming no registration was posted");
  } catch (const TransferRefused& x) {
    REQUIRE(x.code() == TransferErrc::bad_spec);
  }
  ConnectorOptions bad;
  bad.transfer_deadline = 0ms;
  REQUIRE_THROWS_AS(Connector(bad), std::invalid_argument);
  REQUIRE(e.conn.debug_port() == 0);
}

TEST_CASE("public api: options are refused by their public names", "[api]") {
  const auto refused = [](const ConnectorOptions& o) -> std::string {
    try {
      Connector c(o);
    } catch (const std::invalid_argument& x) {
      return x.what();
    }
    return "";
  };
  ConnectorOptions port;
  port.debug_port = 70000;
  REQUIRE(refused(port).find("debug_port") != std::string::npos);
  ConnectorOptions address;
  address.debug_port = 0;
  address.debug_address = "0.0.0.0";  // not loopback: a Connector never serves it
  REQUIRE_FALSE(refused(address).empty());
  if (sim_backend()) {
    ConnectorOptions device;
    device.device = 4096;
    const std::string why = refused(device);
    REQUIRE(why.find("device") != std::string::npos);
    REQUIRE(why.find("reactor") == std::string::npos);  // no internal name reaches the engine
  }
}

TEST_CASE("public api: co_await fenced() continues on the engine's executor once the transfers are terminal",
          "[api]") {
  Engine e;
  e.plane.write(0, pattern(8 * kBlockBytes, 4));
  std::deque<std::function<void()>> engine_queue;  // the engine's executor: this thread
  std::mutex queue_mutex;                          // resume() is called on kvstrand's reactor thread
  Connector::Resume resume = [&](std::function<void()> f) {
    std::lock_guard lk(queue_mutex);
    engine_queue.push_back(std::move(f));
  };
  bool fenced = false;
  std::thread::id resumed_on;
  fence_step(e, resume, fenced, resumed_on);
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (!fenced && std::chrono::steady_clock::now() < end) {
    std::function<void()> f;
    {
      std::lock_guard lk(queue_mutex);
      if (!engine_queue.empty()) {
        f = std::move(engine_queue.front());
        engine_queue.pop_front();
      }
    }
    if (f) f();
    std::this_thread::sleep_for(100us);
  }
  REQUIRE(fenced);
  REQUIRE(resumed_on == std::this_thread::get_id());
  REQUIRE(e.conn.finished().saves.size() == 1);  // terminal, as the fence said
  REQUIRE_THROWS_AS(e.conn.fenced({"r"}, 1s, nullptr), std::invalid_argument);
}
