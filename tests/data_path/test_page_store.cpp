// The PageStore (kvstrand.sglang's data path): pages of the engine's own
// host memory stored in and read back from a real kvstrand-server, one
// chunk a page, byte for byte; calls from several threads at once; a hit
// exists() leased released at its bound; pages not stored counted, never
// thrown.
#include <catch2/catch.hpp>

#include <cstring>
#include <thread>

#include <kvstrand/namespace_id.hpp>
#include "node_tier_support.hpp"
#include "protocol_session.hpp"
#include "data_path/page_store.hpp"
#include "support.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;
using Store = data_path::PageStore;

namespace {

constexpr std::uint32_t kPage = 64;  // tokens, the server's --chunk-tokens
constexpr std::uint32_t kPages = 32;
constexpr std::uint64_t kPiece = 2048;  // bytes of each of a page's two pieces

// A host pool of two planes (K and V of every page), as SGLang's page_first pool.
struct Pool {
  std::vector<std::byte> k = std::vector<std::byte>(kPages * kPiece), v = std::vector<std::byte>(kPages * kPiece);
  Registration registration() {
    kv::Layout l;
    l.model_id = "pages";
    l.layout_name = "pages";
    l.planes = {{"k", kPiece}, {"v", kPiece}};
    l.block_tokens = l.chunk_tokens = kPage;
    l.dtype = "bf16";
    return Registration{l, {{k.data(), kPages}, {v.data(), kPages}}};
  }
  void fill(std::uint32_t page, std::uint64_t seed) {
    for (std::uint64_t i = 0; i < kPiece; ++i) {
      k[page * kPiece + i] = static_cast<std::byte>((seed * 131 + i) & 0xff);
      v[page * kPiece + i] = static_cast<std::byte>((seed * 7 + i * 3) & 0xff);
    }
  }
  bool holds(std::uint32_t page, std::uint64_t seed) {
    Pool want;
    want.fill(0, seed);
    return std::memcmp(&k[page * kPiece], want.k.data(), kPiece) == 0 &&
           std::memcmp(&v[page * kPiece], want.v.data(), kPiece) == 0;
  }
};

std::vector<kv::ChunkKey> page_keys(const Registration& r, std::uint64_t seed, std::uint32_t n) {
  std::vector<kv::ChunkKey> out;
  for (std::uint32_t i = 0; i < n; ++i) {
    kv::ChunkKey key{kv::namespace_of(r.layout), 0, {}};
    std::memcpy(key.hash.data(), &seed, sizeof seed);
    std::memcpy(key.hash.data() + 8, &i, sizeof i);
    out.push_back(key);
  }
  return out;
}

PageStoreOptions options(const ServerProcess& srv) {
  PageStoreOptions o;
  o.server_socket = srv.socket_path();
  o.request_timeout = 5s;
  return o;
}

}  // namespace

TEST_CASE("page store: pages set by one store are read back byte for byte by another, the run up to the first "
          "missing page",
          "[server][reactor]") {
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Pool a, b;
  Store writer(options(srv)), reader(options(srv));
  const std::uint32_t wr = writer.register_layout(a.registration());
  const std::uint32_t rd = reader.register_layout(b.registration());
  const auto keys = page_keys(a.registration(), 1, 4);
  for (std::uint32_t p = 0; p < 4; ++p) a.fill(p + 10, p + 100);
  const std::vector<std::uint32_t> src{10, 11, 12, 13};
  REQUIRE(writer.set(wr, std::span(keys).first(3), std::span(src).first(3)) == std::vector<bool>{true, true, true});
  REQUIRE(writer.set(wr, keys, src) == std::vector<bool>(4, true));  // three stored already, one new
  REQUIRE(writer.stats().pages_written == 4);
  REQUIRE(writer.stats().pages_existed == 3);

  auto more = keys;
  more.push_back(page_keys(a.registration(), 2, 1)[0]);  // never stored
  REQUIRE(reader.exists(rd, more) == 4);
  const std::vector<std::uint32_t> dst{0, 1, 2, 3, 4};
  REQUIRE(reader.get(rd, more, dst) == 4);  // under the lease exists() took
  for (std::uint32_t p = 0; p < 4; ++p) REQUIRE(b.holds(p, p + 100));
  REQUIRE(reader.stats().pages_read == 4);
  eventually([&] { return stats(srv.socket_path()).leases == 0; }, "the get's lease released");
  // A page number outside the pool is nothing asked of the server.
  REQUIRE(reader.get(rd, keys, std::vector<std::uint32_t>{0, 1, 2, kPages}) == 0);
}

TEST_CASE("page store: calls from several threads at once each copy their own pages", "[server][reactor]") {
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Pool a, b;
  PageStoreOptions o = options(srv);
  o.copy_threads = 2;
  Store store(o);
  const std::uint32_t wr = store.register_layout(a.registration());
  const std::uint32_t rd = store.register_layout(b.registration());
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (std::uint32_t t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      const auto keys = page_keys(a.registration(), 10 + t, 4);
      std::vector<std::uint32_t> pages;
      for (std::uint32_t i = 0; i < 4; ++i) {
        pages.push_back(t * 4 + i);
        a.fill(t * 4 + i, t * 1000 + i);
      }
      for (int round = 0; round < 20; ++round) {
        if (store.set(wr, keys, pages) != std::vector<bool>(4, true)) ++wrong;
        if (store.exists(rd, keys) != 4 || store.get(rd, keys, pages) != 4) ++wrong;
        for (std::uint32_t i = 0; i < 4; ++i)
          if (!b.holds(t * 4 + i, t * 1000 + i)) ++wrong;
      }
    });
  for (auto& t : threads) t.join();
  REQUIRE(wrong == 0);
  eventually([&] { return stats(srv.socket_path()).leases == 0; }, "every get's lease released");
}

TEST_CASE("page store: a hit exists() leased that no get() names is released at the lease bound",
          "[server][reactor]") {
  ServerProcess srv(kServerFlags);
  REQUIRE(ready_and_full(srv));
  Pool a;
  PageStoreOptions o = options(srv);
  o.lease_bound = 200ms;
  Store store(o);
  const std::uint32_t reg = store.register_layout(a.registration());
  const auto keys = page_keys(a.registration(), 3, 2);
  REQUIRE(store.set(reg, keys, std::vector<std::uint32_t>{0, 1}) == std::vector<bool>{true, true});
  REQUIRE(store.exists(reg, keys, false) == 2);
  eventually([&] { return stats(srv.socket_path()).leases == 0; }, "a lease not asked for released at once");
  REQUIRE(store.exists(reg, keys) == 2);
  REQUIRE(stats(srv.socket_path()).leases == 1);
  eventually([&] { return stats(srv.socket_path()).leases == 0; }, "the lease released at its bound");
  REQUIRE(store.stats().leases_expired == 1);
}

TEST_CASE("page store: with no server calls miss and store nothing (counted), and a bad option is refused naming it",
          "[server][reactor][fault]") {
  PageStoreOptions o;
  o.server_socket = ServerProcess::fresh_socket_path();  // nobody there
  o.request_timeout = 500ms;
  Pool a;
  Store store(o);
  const std::uint32_t reg = store.register_layout(a.registration());  // kept for when one answers
  const auto keys = page_keys(a.registration(), 4, 2);
  REQUIRE(store.exists(reg, keys) == 0);
  REQUIRE(store.get(reg, keys, std::vector<std::uint32_t>{0, 1}) == 0);
  REQUIRE(store.set(reg, keys, std::vector<std::uint32_t>{0, 1}) == std::vector<bool>{false, false});
  REQUIRE(store.stats().pages_not_stored == 2);
  PageStoreOptions bad;
  REQUIRE_THROWS_WITH(Store(bad), Catch::Contains("server_socket"));
  bad.server_socket = "/tmp/x";
  bad.lease_bound = 0ms;
  REQUIRE_THROWS_WITH(Store(bad), Catch::Contains("lease_bound"));
}

TEST_CASE("page store: a store that reads a published tenant registers that tenant's layouts only, and stores and "
          "drops nothing",
          "[server][reactor][tenants]") {
  PageStoreOptions o;
  o.server_socket = ServerProcess::fresh_socket_path();
  o.request_timeout = 500ms;
  o.reads_tenant = "shared";
  Pool a;
  Store store(o);
  // Refused here, before any server is asked: the server would refuse it too.
  REQUIRE_THROWS_WITH(store.register_layout(a.registration()), Catch::Contains("reads_tenant"));
  Registration shared = a.registration();
  shared.layout.tenant = "shared";
  const std::uint32_t reg = store.register_layout(shared);
  const auto keys = page_keys(shared, 4, 2);
  REQUIRE(store.set(reg, keys, std::vector<std::uint32_t>{0, 1}) == std::vector<bool>{false, false});
  REQUIRE(store.stats().pages_not_stored == 2);
  REQUIRE_THROWS_WITH(store.invalidate(reg), Catch::Contains("only that tenant drops them"));
  PageStoreOptions bad = o;
  bad.reads_tenant = "not a name";
  REQUIRE_THROWS_WITH(Store(bad), Catch::Contains("reads_tenant"));
}
