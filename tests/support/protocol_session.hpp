// A protocol-2 session with a real kvstrand-server, for the tests that
// speak to one directly (test_server, test_l2_tier): a small layout of
// 16896-byte objects, its chunk keys, the arena as a client maps it, and
// calls whose failures are test failures.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/namespace_id.hpp>
#include "server_process.hpp"

namespace kvstrand::test {

using namespace kvstrand::proto;
using namespace std::chrono_literals;

inline kv::Layout layout() {
  kv::Layout l;
  l.model_id = "srv";
  l.layout_name = "srv";
  l.planes = {{"k", 2048}, {"v", 2048}};
  l.block_tokens = 16;
  l.chunk_tokens = 64;
  l.checkpoint = {"ring", 512, 64};
  l.dtype = "bf16";
  return l;
}
inline const std::uint64_t kObject = layout().object_bytes(true);  // 16896 B

inline std::vector<kv::ChunkKey> keys(std::uint64_t seed, std::uint32_t chunks) {
  const kv::Layout l = layout();
  std::vector<std::uint32_t> toks(chunks * 64);
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint32_t>(seed * 131 + i);
  return kv::chunk_keys(l, kv::namespace_of(l), toks);
}

inline Reply must_call(Client& c, const Request& r) {
  auto rep = c.call(r);
  REQUIRE(rep.has_value());
  INFO(to_string(rep->status) << ": " << rep->message);
  return *rep;
}

// Hello and register; returns the registration id.
inline std::uint32_t open_session(Client& c) {
  REQUIRE(must_call(c, Hello{kMajor, kMinor, "test", {}}).status == Status::ok);
  Reply r = must_call(c, RegisterLayout{layout()});
  INFO(r.message);
  REQUIRE(r.status == Status::ok);
  REQUIRE(std::get<RegisterReply>(r.payload).object_bytes == kObject);
  return std::get<RegisterReply>(r.payload).registration;
}

inline StatsReply stats(const std::string& socket) {
  Client c(socket);
  REQUIRE(must_call(c, Hello{kMajor, kMinor, "stats", {}}).status == Status::ok);
  return std::get<StatsReply>(must_call(c, Stats{}).payload);
}

inline ReserveReply reserve(Client& c, std::uint32_t reg, const std::vector<kv::ChunkKey>& ks) {
  Reply r = must_call(c, Reserve{reg, ks, std::vector<std::uint8_t>(ks.size(), 1)});
  REQUIRE(r.status == Status::ok);
  return std::get<ReserveReply>(r.payload);
}

inline LookupReply lookup(Client& c, std::uint32_t reg, const std::vector<kv::ChunkKey>& ks) {
  Reply r = must_call(c, Lookup{reg, ks});
  REQUIRE(r.status == Status::ok);
  return std::get<LookupReply>(r.payload);
}

template <class Pred>
void eventually(Pred pred, const char* what) {
  const auto end = std::chrono::steady_clock::now() + 10s;
  while (!pred()) {
    INFO(what);
    REQUIRE(std::chrono::steady_clock::now() < end);
    std::this_thread::sleep_for(20ms);
  }
}

// The arena as a client maps it.
struct Mapped {
  explicit Mapped(int f, std::uint64_t n) : fd(f), bytes(n) {
    p = static_cast<std::byte*>(::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0));
    REQUIRE(p != MAP_FAILED);
  }
  ~Mapped() {
    ::munmap(p, bytes);
    ::close(fd);
  }
  int fd;
  std::uint64_t bytes;
  std::byte* p = nullptr;
};

inline const std::vector<std::string> kFlags = {"--tier-bytes", "16M", "--slab-bytes", "4M", "--chunk-tokens", "64"};


}  // namespace kvstrand::test
