// A kvstrand-server on a disk tier, for test_disk_tier and test_disk_file:
// a scratch directory on the build's disk, the fault hook, the server's
// flags, and a Node (the server with one session whose arena the test maps).
#pragma once

#include <catch2/catch.hpp>

#include <stdlib.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "curl.hpp"
#include "process.hpp"
#include "protocol_session.hpp"
#include "server_process.hpp"

namespace kvstrand::test {

namespace fs = std::filesystem;
using namespace std::chrono_literals;


// A directory on the build's disk, removed at the end.
struct DiskDir {
  DiskDir() {
    std::string t = (fs::current_path() / "disk-test-XXXXXX").string();
    REQUIRE(::mkdtemp(t.data()) != nullptr);
    path = t;
  }
  ~DiskDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file() const { return path + "/kvstrand.disk"; }
  std::string path;
};

// The fault hook, set for the servers this scope starts.
struct Fault {
  explicit Fault(const char* f) { ::setenv("KVSTRAND_TEST_DISK_FAULT", f, 1); }
  ~Fault() { ::unsetenv("KVSTRAND_TEST_DISK_FAULT"); }
};

// 16 MiB arena (816 objects of kObject once 4 KiB-aligned), 64 MiB of disk.
inline std::vector<std::string> disk_flags(const DiskDir& d, std::uint16_t port, std::vector<std::string> extra = {}) {
  std::vector<std::string> f = kFlags;
  for (const std::string& a : {std::string("--disk"), d.path, std::string("--disk-bytes"), std::string("64M"),
                               std::string("--http"), "127.0.0.1:" + std::to_string(port)})
    f.push_back(a);
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

inline std::vector<std::byte> object_of(int seed, std::size_t i) {
  std::vector<std::byte> o(kObject);
  for (std::size_t b = 0; b < o.size(); ++b) o[b] = static_cast<std::byte>((seed * 131 + i * 17 + b * 7) & 0xff);
  return o;
}

// A server on a disk, with one session whose arena this test maps.
struct Node {
  Node(const DiskDir& d, std::vector<std::string> extra = {})
      : port(free_port()), srv(disk_flags(d, port, std::move(extra))) {
    connect();
  }
  void connect() {
    REQUIRE(srv.ready());
    REQUIRE(Client(srv.socket_path()).wait_full());
    c.emplace(srv.socket_path());
    int fd = -1;
    REQUIRE(c->hello(&fd)->status == Status::ok);
    arena.reset();
    arena.emplace(fd, 16u << 20);
    auto r = must_call(*c, RegisterLayout{layout()});
    REQUIRE(r.status == Status::ok);
    reg = std::get<RegisterReply>(r.payload).registration;
  }
  // Killed and started again on the same disk (the arena, a memfd, is new).
  void restart(const DiskDir& d, std::vector<std::string> extra = {}) {
    c.reset();
    arena.reset();
    srv.restart(disk_flags(d, port, std::move(extra)));
    connect();
  }

  // Stores prompt `seed` of `chunks` chunks, waits until the disk took them.
  void store(int seed, std::uint32_t chunks) {
    const auto ks = keys(seed, chunks);
    ReserveReply r = reserve(*c, reg, ks);
    for (std::size_t i = 0; i < ks.size(); ++i) {
      REQUIRE(r.chunks[i] == ChunkState::reserved);
      const auto o = object_of(seed, i);
      REQUIRE(r.offsets[i] % 4096 == 0);  // aligned for the disk's O_DIRECT
      std::memcpy(arena->p + r.offsets[i], o.data(), o.size());
    }
    REQUIRE(must_call(*c, Commit{r.reservation, true}).status == Status::ok);
  }
  // The chunks of prompt `seed` a lookup hits, each checked byte for byte.
  std::uint32_t load(int seed, std::uint32_t chunks) {
    LookupReply l = lookup(*c, reg, keys(seed, chunks));
    const std::uint32_t hit = l.hit.tokens / 64;
    for (std::uint32_t i = 0; i < hit; ++i) {
      INFO("prompt " << seed << " chunk " << i);
      REQUIRE(std::memcmp(arena->p + l.offsets[i], object_of(seed, i).data(), kObject) == 0);
    }
    if (l.lease != 0) REQUIRE(must_call(*c, Release{l.lease}).status == Status::ok);
    return hit;
  }
  // kvstrand_server_disk_NAME (a sample without labels), or a labelled one.
  double metric(const std::string& name) {
    const std::string body = curl(port, "/metrics").body;
    const std::string line = "\nkvstrand_server_" + name + " ";
    const auto at = body.find(line);
    if (at == std::string::npos) return -1;
    return std::stod(body.substr(at + line.size()));
  }
  double disk(const std::string& name) { return metric("disk_" + name); }
  // A bound, not a timing: the disk's writes behind are as slow as the host
  // under CI's parallel suites and sanitizers (10 s was passed there twice);
  // a write dropped or failed instead shows in the message.
  void written(double n) {
    const auto end = std::chrono::steady_clock::now() + 60s;
    while (disk("written_total") < n) {
      INFO("the disk wrote every committed object: written " << disk("written_total") << " of " << n << ", dropped "
                                                               << disk("write_dropped_total") << ", errors "
                                                               << disk("errors_total"));
      REQUIRE(std::chrono::steady_clock::now() < end);
      std::this_thread::sleep_for(20ms);
    }
  }

  // Prompts first..last, each written to disk before the next is stored:
  // the write-behind queue holds an eighth of the arena (about 100 of these
  // objects) and drops, counted, what a disk slower than the saves leaves
  // over, as CI's loaded host once did with 200 stored at once.
  void store_written(int first, int last, std::uint32_t chunks) {
    const double before = disk("written_total");
    for (int p = first; p <= last; ++p) {
      store(p, chunks);
      written(before + static_cast<double>(chunks) * (p - first + 1));
    }
  }

  std::uint16_t port;
  ServerProcess srv;
  std::optional<Client> c;
  std::optional<Mapped> arena;
  std::uint32_t reg = 0;
};

}  // namespace kvstrand::test
