// bench_transfer's save scaling: the kvstrand-server it saves into, and the
// client processes (kvstrand save clients and raw-copy baseline clients)
// it starts and sums. Included by bench_transfer.cpp only.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "device/copy.hpp"
#include "device/device_buffer.hpp"
#include "device/event.hpp"
#include "device/host_registration.hpp"
#include "device/stream.hpp"
#include "connector/connector.hpp"
#include "reference_geometry.hpp"

extern char** environ;

namespace kvstrand::bench {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline pid_t spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

inline std::string self_dir() { return std::filesystem::read_symlink("/proc/self/exe").parent_path().string(); }

// A kvstrand-server on a private socket, killed with the benchmark.
struct Server {
  std::string socket = "/tmp/kvstrand-bench-" + std::to_string(::getpid()) + ".sock";
  pid_t pid = -1;
  explicit Server(const std::string& binary) {
    pid = spawn({binary, "--socket", socket, "--tier-bytes", "2G", "--slab-bytes", "256M", "--chunk-tokens", "256", "--log-level", "warn"});
    if (pid < 0) die("cannot start " + binary);
  }
  ~Server() {
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
    ::unlink(socket.c_str());
  }
};

inline std::unique_ptr<connector::Connector> connect_when_up(
    const std::string& socket, Pool& pool, const kv::Layout& l, std::chrono::microseconds idle_spin,
    std::string load_path = connector::ConnectorOptions{}.load_path) {
  const auto end = Clock::now() + 10s;
  // A Connector started before the server keeps its registration and
  // attaches at its next request after the server is up (at most every 2 s);
  // this waits for the socket so that the arena is pinned before anything
  // is measured, with no request needed to attach.
  while (!std::filesystem::exists(socket)) {
    if (Clock::now() > end) die("the server's socket " + socket + " did not appear within 10 s");
    std::this_thread::sleep_for(20ms);
  }
  for (;;) {
    try {
      NodeClient c(socket, pool, l, idle_spin, load_path);
      // Measured in steady state: the arena pinned for this device first.
      if (c.wait_pinned(120s) < 0) die("the arena was not pinned within 120 s");
      return std::move(c.conn);
    } catch (const std::exception& e) {
      if (Clock::now() > end) die(std::string("cannot reach the server: ") + e.what());
      std::this_thread::sleep_for(20ms);
    }
  }
}

// One scaling client: saves distinct prompts, 2 in flight, from `start`
// (steady clock, shared by processes on Linux) for `seconds`; prints the
// bytes of the saves that completed in the window.
inline int save_client(const std::string& socket, int index, std::int64_t start_ns, double seconds,
                       std::chrono::microseconds idle_spin) {
  const kv::Layout l = reference_layout();
  Pool pool(64);
  auto conn = connect_when_up(socket, pool, l, idle_spin);
  std::vector<kv::BlockId> blocks(32);
  for (kv::BlockId b = 0; b < 32; ++b) blocks[b] = b * 2;
  const std::uint64_t bytes_per_save = 32 * kBlockBytes + 2 * kImageBytes;
  const auto start = Clock::time_point(std::chrono::nanoseconds(start_ns));
  const auto stop = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::this_thread::sleep_until(start);
  std::uint64_t next = static_cast<std::uint64_t>(index + 1) << 32, done = 0;
  int in_flight = 0;
  bool failed = false;
  while (Clock::now() < stop || in_flight > 0) {
    while (in_flight < 2 && Clock::now() < stop) {
      conn->save(save_spec(l, next++, blocks));
      ++in_flight;
    }
    const auto f = conn->finished();
    for (const auto& o : f.saves) {
      --in_flight;
      if (!o.ok) failed = true;
      else if (Clock::now() <= stop) done += bytes_per_save;
    }
    if (f.saves.empty()) std::this_thread::sleep_for(50us);  // leave the cores to the copies
  }
  conn->close();
  std::printf("%llu\n", static_cast<unsigned long long>(done));
  return failed ? 1 : 0;
}

// The baseline of save_client: the same bytes a save moves, as one
// contiguous D2H copy from a device buffer into slot (index, k) of the
// shared arena on memfd `fd` (mapped and pinned here, as a kvstrand client
// pins the server's arena), 2 in flight on one stream, from `start` for
// `seconds`; prints the bytes of the copies that completed in the window.
inline int raw_client(int fd, int index, std::int64_t start_ns, double seconds) {
  const std::uint64_t bytes_per_save = 32 * kBlockBytes + 2 * kImageBytes;
  const std::size_t arena = static_cast<std::size_t>(::lseek(fd, 0, SEEK_END));
  void* p = ::mmap(nullptr, arena, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED || arena < (index + 1) * 2 * bytes_per_save) die("raw client: cannot map the shared arena");
  auto pinned = must(device::HostRegistration::register_range(p, arena), "host registration");
  auto dev = must(device::DeviceBuffer::allocate(bytes_per_save), "device");
  auto stream = must(device::Stream::create(), "stream");
  std::vector<device::Event> events;
  for (int k = 0; k < 2; ++k) events.push_back(must(device::Event::create(), "event"));
  const auto start = Clock::time_point(std::chrono::nanoseconds(start_ns));
  const auto stop = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::this_thread::sleep_until(start);
  bool busy[2] = {false, false};
  std::uint64_t done = 0;
  while (Clock::now() < stop || busy[0] || busy[1]) {
    for (int k = 0; k < 2; ++k) {
      if (busy[k]) {
        const device::Status q = events[k].query();
        if (q.code() == device::Errc::not_ready) continue;
        if (!q.ok()) die("raw client: a copy failed");
        busy[k] = false;
        if (Clock::now() <= stop) done += bytes_per_save;
      }
      if (Clock::now() < stop) {
        std::byte* slot = pinned.data() + (static_cast<std::size_t>(index) * 2 + k) * bytes_per_save;
        if (!device::copy_d2h(stream, slot, dev.data(), bytes_per_save).ok() || !events[k].record(stream).ok())
          die("raw client: cannot queue a copy");
        busy[k] = true;
      }
    }
    std::this_thread::sleep_for(50us);  // as save_client: leave the cores to the copies
  }
  std::printf("%llu\n", static_cast<unsigned long long>(done));
  return 0;
}

// Runs n save clients at once (raw clients on memfd `raw_fd` when >= 0);
// aggregate GB/s.
inline double save_scaling(const std::string& socket, int n, double seconds, const std::string& client_path,
                    int raw_fd = -1) {
  const auto start = Clock::now() + 1500ms;  // every client registered by then
  const auto start_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(start.time_since_epoch()).count();
  std::vector<pid_t> pids;
  std::vector<std::string> outs;
  std::vector<FILE*> pipes;
  for (int i = 0; i < n; ++i) {
    const std::string who = raw_fd >= 0 ? "--raw-client " + std::to_string(raw_fd) : "--save-client " + socket;
    const std::string cmd = self_dir() + "/bench_transfer " + who + " --index " + std::to_string(i) +
                            " --start-ns " + std::to_string(start_ns) + " --seconds " + std::to_string(seconds) +
                            " --client-path " + client_path;
    pipes.push_back(::popen(cmd.c_str(), "r"));
    if (!pipes.back()) die("cannot start a save client");
  }
  std::uint64_t total = 0;
  for (FILE* p : pipes) {
    unsigned long long bytes = 0;
    if (std::fscanf(p, "%llu", &bytes) != 1) die("a save client failed");
    total += bytes;
    if (::pclose(p) != 0) die("a save client's saves failed");
  }
  return static_cast<double>(total) / seconds / 1e9;
}

}  // namespace kvstrand::bench
