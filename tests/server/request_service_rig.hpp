// The request service's test rig (test_request_service, test_request_service_tenants):
// a small layout of 4 KiB objects and its keys, a level double below the
// arena, and a service over four 64 KiB slabs with both.
#pragma once

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <exception>
#include <optional>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/namespace_id.hpp>
#include "server/request_service.hpp"

namespace kvstrand::test {

using namespace kvstrand::proto;
using server::Client;
using server::RequestService;


inline constexpr std::uint64_t kSlab = 64 << 10;  // 16 objects of 4 KiB
inline constexpr std::uint64_t kObject = 4 << 10;

inline kv::Layout layout() {
  kv::Layout l;
  l.model_id = "m";
  l.layout_name = "plain";
  l.planes = {{"kv", 1024}};
  l.block_tokens = 16;
  l.chunk_tokens = 64;
  l.dtype = "bf16";
  return l;
}

inline std::vector<kv::ChunkKey> keys(std::uint32_t seed, std::size_t n) {
  std::vector<std::uint32_t> toks(n * 64);
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = seed * 1000 + static_cast<std::uint32_t>(i);
  return kv::chunk_keys(layout(), kv::namespace_of(layout()), toks);
}

// A level below the arena that counts what is written behind to it and,
// asked to promote, says it holds the first `holds` of what it is asked for
// (it copies nothing: the service only reads the count).
struct FakeLevel final : server::LowerLevel {
  const char* name() const noexcept override { return "fake"; }
  void start() override {}
  void committed(tier::Index&, std::span<const std::uint32_t> slots) override { committed_objects += slots.size(); }
  boost::asio::awaitable<server::Promoted> promote(tier::Index&, std::vector<kv::ChunkKey> keys,
                                                  tier::TenantId) override {
    asked.push_back(keys);
    co_return server::Promoted{std::min(holds, keys.size()), why};
  }
  boost::asio::awaitable<std::size_t> drain(std::chrono::milliseconds) override { co_return 0; }
  boost::asio::awaitable<void> close(std::chrono::milliseconds) override { co_return; }
  std::size_t drop(const kv::Digest& ns) override {
    dropped.push_back(ns);
    return 1;
  }

  std::size_t committed_objects = 0;
  std::size_t holds = 0;
  server::LevelMiss why = server::LevelMiss::none;
  std::vector<std::vector<kv::ChunkKey>> asked;
  std::vector<kv::Digest> dropped;
};

struct Fixture {
  tier::SizeClasses classes{kSlab};
  FakeLevel near, far;  // the disk and L2, say
  std::size_t& committed_objects = near.committed_objects;
  RequestService service;

  explicit Fixture(server::ServiceRules rules = {64, 8 * kObject, 8 * kObject})
      : service(rules, server::ServerFacts{4 * kSlab, kSlab, false, [] { return 4 * kSlab; }, [] { return 2; }, 0x5eed, {}},
                classes, {&near, &far}) {
    for (std::uint32_t s = 0; s < 4; ++s) classes.add_slab(s);
  }

  // RequestService::promote, run to its end.
  void promote(Client& c, const Lookup& m, bool gone = false) {
    boost::asio::io_context ctx;
    std::optional<std::exception_ptr> ended;
    boost::asio::co_spawn(ctx, service.promote(c, m, gone), [&](std::exception_ptr e) { ended = e; });
    ctx.run();
    REQUIRE(ended.has_value());
    if (*ended) std::rethrow_exception(*ended);
  }

  // A client that said hello and registered the layout: its registration id.
  std::uint32_t start(Client& c) {
    REQUIRE(service.handle(c, Hello{}).status == Status::ok);
    Reply r = service.handle(c, RegisterLayout{layout()});
    REQUIRE(r.status == Status::ok);
    return std::get<RegisterReply>(r.payload).registration;
  }
  // Reserves and commits `n` chunks of prompt `seed`.
  void store(Client& c, std::uint32_t reg, std::uint32_t seed, std::size_t n) {
    Reply r = service.handle(c, Reserve{reg, keys(seed, n), std::vector<std::uint8_t>(n, 0)});
    REQUIRE(r.status == Status::ok);
    REQUIRE(service.handle(c, Commit{std::get<ReserveReply>(r.payload).reservation, true}).status == Status::ok);
  }
};

inline Client client(std::uint64_t session, tier::Owner owner) {
  Client c;
  c.session = session;
  c.owner = owner;
  return c;
}

}  // namespace kvstrand::test
