// kvstrand-tier-client: an engine-like process for the multi-process server
// tests. It owns device memory, registers it with kvstrand-server through a
// Connector over the node tier, and moves prompts whose bytes are a pure
// function of the prompt number, so any process can verify what another
// stored, byte for byte.
//
//   kvstrand-tier-client --socket S --id N --peers M --rounds R
//     Each round saves its own prompt and a prompt shared by every client,
//     then looks up and loads the shared prompt and the previous round's
//     prompt of client (N+1) % M, verifying every byte of KV and state. At
//     the end it waits for the neighbour's last prompt and verifies it too.
//     Prints "client N: saves S, loads L, verified B bytes, mismatches X";
//     exits 0 only with no mismatch and at least one neighbour prompt verified.
//
//   kvstrand-tier-client --socket S --hold
//     Saves prompt 1, looks it up (the server now holds a lease for this
//     process), prints "holding" and sleeps until killed.
//
//   kvstrand-tier-client --socket S --hold-then-load SECONDS
//     As --hold, then after SECONDS (a SIGSTOP stops that clock too) loads
//     prompt 1 through its lease and verifies it; exits 0 when exact.
//
//   kvstrand-tier-client --socket S --stall-save
//     Holds its own save stream (sim hook), starts a save of prompt 2, prints
//     "reserved" once the copy into the reserved objects is queued, and
//     sleeps until killed: the SIGKILL-between-reserve-and-commit test.
//
//   kvstrand-tier-client --socket S --export-lease FILE
//     Saves prompt 1, looks it up, writes the lease's handoff bytes to FILE
//     (Connector::export_lease: the scheduler's side), prints "exported" and
//     sleeps until killed.
//
//   kvstrand-tier-client --socket S --adopt-lease FILE [--then-hold]
//     Adopts the lease in FILE (the worker's side) and loads prompt 1
//     through it, verifying every byte; prints "adopted load: exact" and
//     exits 0. With --then-hold it prints "adopted" instead and sleeps until
//     killed. A lease that is gone: prints "adopt: miss", exits 3.
//
//   kvstrand-tier-client --socket S --fill N
//     Saves prompts 100.. 100+N-1; prints "filled: stored S, refused R".
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "device/copy.hpp"
#include "device/device.hpp"
#include "device/device_buffer.hpp"
#include "device/pinned_buffer.hpp"
#include "device/stream.hpp"
#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/namespace_id.hpp>
#include "random_bytes.hpp"
#include "device/sim_hooks.hpp"
#include "connector/connector.hpp"

using namespace kvstrand;
using namespace std::chrono_literals;

namespace {

constexpr std::uint32_t kBlocks = 64;
constexpr std::uint64_t kBlockBytes = 2048;
constexpr std::uint64_t kImageBytes = 512;
constexpr std::uint32_t kSlots = 16;
constexpr std::uint32_t kChunks = 4;  // per prompt; 4 blocks of 16 tokens per 64-token chunk
constexpr std::uint32_t kPlanes = 2;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "kvstrand-tier-client: %s\n", what.c_str());
  std::exit(2);
}

template <class T>
T must(device::Result<T> r, const char* what) {
  if (!r.ok()) die(std::string(what) + ": " + r.status().describe());
  return std::move(r).value();
}

std::uint64_t mix(std::uint64_t prompt, std::uint64_t a, std::uint64_t b) {
  return prompt * 1'000'003 + a * 1009 + b;
}

struct Client {
  kv::Layout layout;
  kv::Digest ns{};
  device::Stream stream = must(device::Stream::create(), "stream");
  std::vector<device::DeviceBuffer> planes;
  std::optional<device::DeviceBuffer> state;
  std::optional<device::PinnedBuffer> staging;
  std::unique_ptr<connector::Connector> conn;
  std::uint64_t lease = 0;  // the last lookup's
  kvstrand::Finished pending;  // outcomes drained but not yet asked for
  std::uint64_t saves = 0, loads = 0, verified = 0, mismatches = 0;

  explicit Client(const std::string& socket) {
    layout.model_id = "tier-client";
    layout.layout_name = "tier-client";
    layout.planes = {{"k", kBlockBytes}, {"v", kBlockBytes}};
    layout.block_tokens = 16;
    layout.chunk_tokens = 64;
    layout.checkpoint = {"ring", kImageBytes, 64};
    layout.dtype = "bf16";
    ns = kv::namespace_of(layout);
    for (std::uint32_t p = 0; p < kPlanes; ++p)
      planes.push_back(must(device::DeviceBuffer::allocate(kBlocks * kBlockBytes), "plane"));
    state.emplace(must(device::DeviceBuffer::allocate(kSlots * kImageBytes), "state"));
    staging.emplace(must(device::PinnedBuffer::allocate(kBlocks * kBlockBytes), "pinned"));
    connector::ConnectorOptions o;
    o.server_socket = socket;
    o.server_request_timeout = 5s;
    o.transfer_deadline = 30s;
    conn = std::make_unique<connector::Connector>(o);
    kvstrand::Registration reg;
    reg.layout = layout;
    for (auto& p : planes) reg.planes.push_back({p.data(), kBlocks});
    reg.state = {state->data(), kSlots};
    conn->register_layout(reg);
  }

  std::vector<kv::ChunkKey> keys(std::uint64_t prompt) const {
    std::vector<std::uint32_t> toks(kChunks * layout.chunk_tokens);
    for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint32_t>(prompt * 7919 + i * 31);
    return kv::chunk_keys(layout, ns, toks);
  }

  void put(void* dev, const std::vector<std::byte>& bytes) {
    std::memcpy(staging->data(), bytes.data(), bytes.size());
    if (!device::copy_h2d(stream, dev, staging->data(), bytes.size()).ok() || !stream.synchronize().ok())
      die("writing device memory failed");
  }
  std::vector<std::byte> get(const void* dev, std::size_t n) {
    if (!device::copy_d2h(stream, staging->data(), dev, n).ok() || !stream.synchronize().ok())
      die("reading device memory failed");
    return {staging->data(), staging->data() + n};
  }

  // Prompt `prompt`'s chunks [0, chunks) into blocks [0, 4 chunks), images in slots 0.. .
  void write_prompt(std::uint64_t prompt, std::uint32_t chunks) {
    for (std::uint32_t p = 0; p < kPlanes; ++p)
      for (std::uint32_t b = 0; b < chunks * 4; ++b)
        put(planes[p].data() + b * kBlockBytes, test::random_bytes(kBlockBytes, mix(prompt, p, b)));
    for (std::uint32_t c = 0; c < chunks; ++c)
      put(state->data() + c * kImageBytes, test::random_bytes(kImageBytes, mix(prompt, 99, c)));
  }

  template <class Pred>
  void wait(Pred done) {
    const auto end = std::chrono::steady_clock::now() + 20s;
    while (!done()) {
      if (std::chrono::steady_clock::now() > end) die("timed out waiting for the server");
      auto f = conn->finished();
      for (auto& o : f.saves) pending.saves.push_back(o);
      for (auto& o : f.loads) pending.loads.push_back(o);
      for (auto& o : f.lookups) pending.lookups.push_back(o);
      std::this_thread::sleep_for(200us);
    }
  }

  kvstrand::TransferOutcome save(std::uint64_t prompt, const std::string& req) {
    write_prompt(prompt, kChunks);
    kv::TransferSpec s;
    s.request = req;
    s.tokens = {0, kChunks * layout.chunk_tokens};
    s.keys = keys(prompt);
    for (kv::BlockId b = 0; b < kChunks * 4; ++b) s.blocks.push_back(b);
    s.with_state = true;
    for (std::uint32_t c = 0; c < kChunks; ++c) s.state_slots.push_back(static_cast<std::int32_t>(c));
    conn->save(s);
    wait([&] { return !pending.saves.empty(); });
    auto o = pending.saves.front();
    pending.saves.clear();
    ++saves;
    return o;
  }

  // Chunks of `prompt` the server holds (leased now, for the next load).
  std::uint32_t lookup(std::uint64_t prompt) {
    conn->lookup(keys(prompt));
    wait([&] { return !pending.lookups.empty(); });
    const auto tokens = pending.lookups.front().hit.tokens;
    lease = pending.lookups.front().lease;
    pending.lookups.clear();
    return tokens / layout.chunk_tokens;
  }

  // Loads chunks [0, chunks) of `prompt` into blocks 32.. and slot 8, then
  // compares every byte with what the prompt's bytes must be.
  bool load_and_verify(std::uint64_t prompt, std::uint32_t chunks, const std::string& req) {
    for (std::uint32_t p = 0; p < kPlanes; ++p)  // stale bytes a missed copy would leave
      put(planes[p].data() + 32 * kBlockBytes, std::vector<std::byte>(chunks * 4 * kBlockBytes, std::byte{0}));
    kv::TransferSpec s;
    s.request = req;
    s.tokens = {0, chunks * layout.chunk_tokens};
    auto all = keys(prompt);
    s.keys.assign(all.begin(), all.begin() + chunks);
    for (kv::BlockId b = 32; b < 32 + chunks * 4; ++b) s.blocks.push_back(b);
    s.with_state = true;
    s.state_slots = {8};
    s.tier_lease = std::exchange(lease, 0);
    conn->load(s);
    wait([&] { return !pending.loads.empty(); });
    auto o = pending.loads.front();
    pending.loads.clear();
    ++loads;
    if (!o.ok) {
      std::fprintf(stderr, "load of prompt %llu failed: %s\n", static_cast<unsigned long long>(prompt),
                   o.reason.c_str());
      ++mismatches;
      return false;
    }
    bool same = true;
    for (std::uint32_t p = 0; p < kPlanes; ++p)
      for (std::uint32_t b = 0; b < chunks * 4; ++b)
        same &= get(planes[p].data() + (32 + b) * kBlockBytes, kBlockBytes) ==
                test::random_bytes(kBlockBytes, mix(prompt, p, b));
    same &= get(state->data() + 8 * kImageBytes, kImageBytes) ==
            test::random_bytes(kImageBytes, mix(prompt, 99, chunks - 1));
    if (same) {
      verified += (chunks * 4 * kPlanes) * kBlockBytes + kImageBytes;
    } else {
      std::fprintf(stderr, "prompt %llu: bytes differ\n", static_cast<unsigned long long>(prompt));
      ++mismatches;
    }
    return same;
  }
};

int run_peers(const std::string& socket, int id, int peers, int rounds) {
  Client c(socket);
  auto own = [](int client, int round) { return static_cast<std::uint64_t>(1000 * (client + 1) + round); };
  const int neighbour = (id + 1) % peers;
  int neighbour_verified = 0;
  for (int r = 0; r < rounds; ++r) {
    const std::uint64_t shared = static_cast<std::uint64_t>(r % 3 + 1);
    for (std::uint64_t p : {own(id, r), shared}) {
      auto o = c.save(p, "save-" + std::to_string(p));
      if (!o.ok) die("save of prompt " + std::to_string(p) + " failed: " + o.reason);
    }
    if (const auto n = c.lookup(shared); n > 0) c.load_and_verify(shared, n, "load-shared");
    if (r > 0) {
      const auto p = own(neighbour, r - 1);
      if (const auto n = c.lookup(p); n > 0 && c.load_and_verify(p, n, "load-" + std::to_string(p)))
        ++neighbour_verified;
    }
  }
  // The neighbour's last prompt, once it is there (it may still be saving).
  const auto last = own(neighbour, rounds - 1);
  const auto end = std::chrono::steady_clock::now() + 20s;
  std::uint32_t n = 0;
  while ((n = c.lookup(last)) < kChunks && std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(20ms);
  if (n == kChunks && c.load_and_verify(last, n, "load-last")) ++neighbour_verified;
  c.conn->close();
  std::printf("client %d: saves %llu, loads %llu, verified %llu bytes, neighbour prompts %d, mismatches %llu\n", id,
              static_cast<unsigned long long>(c.saves), static_cast<unsigned long long>(c.loads),
              static_cast<unsigned long long>(c.verified), neighbour_verified,
              static_cast<unsigned long long>(c.mismatches));
  return c.mismatches == 0 && neighbour_verified > 0 ? 0 : 1;
}

int run_hold(const std::string& socket, int load_after_s) {
  Client c(socket);
  if (auto o = c.save(1, "save-1"); !o.ok) die("save failed: " + o.reason);
  if (c.lookup(1) != kChunks) die("lookup of the saved prompt missed");
  std::printf("holding\n");
  std::fflush(stdout);
  if (load_after_s < 0)
    for (;;) std::this_thread::sleep_for(1s);  // until SIGKILL
  // Counted in small steps: a SIGSTOP stops this clock as well.
  for (int i = 0; i < load_after_s * 10; ++i) std::this_thread::sleep_for(100ms);
  const bool exact = c.load_and_verify(1, kChunks, "load-1");
  std::printf("load after hold: %s\n", exact ? "exact" : "WRONG");
  c.conn->close();
  return exact ? 0 : 1;
}

int run_stall_save(const std::string& socket) {
  Client c(socket);
  device::Stream* saves = c.conn->tier_streams().save;
  if (saves == nullptr || !device::sim::hold_stream(*saves).ok())
    die("--stall-save needs the sim backend's stream hold");
  c.write_prompt(2, kChunks);
  kv::TransferSpec s;
  s.request = "save-2";
  s.tokens = {0, kChunks * c.layout.chunk_tokens};
  s.keys = c.keys(2);
  for (kv::BlockId b = 0; b < kChunks * 4; ++b) s.blocks.push_back(b);
  c.conn->save(s);
  const auto end = std::chrono::steady_clock::now() + 20s;
  for (;;) {
    auto live = c.conn->transfers();
    if (!live.empty() && live[0].state == connector::TransferState::pending) break;  // reserved, copy queued
    if (std::chrono::steady_clock::now() > end) die("the save never reached its copy");
    std::this_thread::sleep_for(5ms);
  }
  std::printf("reserved\n");
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(1s);  // until SIGKILL
}

int run_export(const std::string& socket, const std::string& file) {
  Client c(socket);
  if (auto o = c.save(1, "save-1"); !o.ok) die("save failed: " + o.reason);
  if (c.lookup(1) != kChunks) die("lookup of the saved prompt missed");
  const std::vector<std::byte> bytes = c.conn->export_lease(std::exchange(c.lease, 0));
  std::FILE* f = std::fopen((file + ".tmp").c_str(), "wb");
  if (f == nullptr || std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size() || std::fclose(f) != 0)
    die("cannot write " + file);
  std::rename((file + ".tmp").c_str(), file.c_str());
  std::printf("exported %zu bytes\n", bytes.size());
  std::fflush(stdout);
  for (;;) std::this_thread::sleep_for(1s);  // until SIGKILL
}

int run_adopt(const std::string& socket, const std::string& file, bool then_hold) {
  Client c(socket);
  std::vector<std::byte> bytes;
  if (std::FILE* f = std::fopen(file.c_str(), "rb")) {
    std::byte buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) bytes.insert(bytes.end(), buf, buf + n);
    std::fclose(f);
  } else {
    die("cannot read " + file);
  }
  c.conn->adopt_lease(bytes);
  c.wait([&] { return !c.pending.lookups.empty(); });
  const auto got = c.pending.lookups.front();
  c.pending.lookups.clear();
  if (got.hit.tokens == 0) {
    std::printf("adopt: miss\n");
    c.conn->close();
    return 3;
  }
  if (got.hit.tokens != kChunks * c.layout.chunk_tokens || got.lease == 0) die("adopt: a partial hit");
  if (then_hold) {
    std::printf("adopted\n");
    std::fflush(stdout);
    for (;;) std::this_thread::sleep_for(1s);  // until SIGKILL
  }
  c.lease = got.lease;
  const bool exact = c.load_and_verify(1, kChunks, "load-adopted");
  std::printf("adopted load: %s\n", exact ? "exact" : "WRONG");
  c.conn->close();
  return exact ? 0 : 1;
}

int run_fill(const std::string& socket, int n) {
  Client c(socket);
  int stored = 0, refused = 0;
  for (int i = 0; i < n; ++i) {
    auto o = c.save(100 + static_cast<std::uint64_t>(i), "fill-" + std::to_string(i));
    (o.ok ? stored : refused) += 1;
  }
  c.conn->close();
  std::printf("filled: stored %d, refused %d\n", stored, refused);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket;
  int id = 0, peers = 1, rounds = 4, load_after = -1, fill = 0;
  bool hold = false, stall = false, then_hold = false;
  std::string export_to, adopt_from;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(a + " needs a value");
      return argv[++i];
    };
    if (a == "--socket") socket = value();
    else if (a == "--id") id = std::stoi(value());
    else if (a == "--peers") peers = std::stoi(value());
    else if (a == "--rounds") rounds = std::stoi(value());
    else if (a == "--hold") hold = true;
    else if (a == "--hold-then-load") {
      hold = true;
      load_after = std::stoi(value());
    } else if (a == "--stall-save") stall = true;
    else if (a == "--fill") fill = std::stoi(value());
    else if (a == "--export-lease") export_to = value();
    else if (a == "--adopt-lease") adopt_from = value();
    else if (a == "--then-hold") then_hold = true;
    else die("unknown argument " + a);
  }
  if (socket.empty() || peers < 1 || id < 0 || id >= peers || rounds < 1) die("bad arguments (see the file header)");
  if (auto n = device::device_count(); !n.ok() || *n == 0) die("no device");
  (void)device::select_device(0);
  try {
    if (stall) return run_stall_save(socket);
    if (!export_to.empty()) return run_export(socket, export_to);
    if (!adopt_from.empty()) return run_adopt(socket, adopt_from, then_hold);
    if (fill > 0) return run_fill(socket, fill);
    return hold ? run_hold(socket, load_after) : run_peers(socket, id, peers, rounds);
  } catch (const std::exception& e) {
    die(e.what());
  }
}
