// kvstrand-server's request rules without a socket: the order a client must
// follow, its own registrations, its quotas, and what each request does to
// the index (test_server runs the same through real processes).
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <catch2/catch.hpp>
#include <cstring>
#include <exception>
#include <optional>
#include <tuple>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/namespace_id.hpp>
#include "server/request_service.hpp"

using namespace kvstrand;
using namespace kvstrand::proto;
using server::Client;
using server::RequestService;

namespace {

constexpr std::uint64_t kSlab = 64 << 10;  // 16 objects of 4 KiB
constexpr std::uint64_t kObject = 4 << 10;

kv::Layout layout() {
  kv::Layout l;
  l.model_id = "m";
  l.layout_name = "plain";
  l.planes = {{"kv", 1024}};
  l.block_tokens = 16;
  l.chunk_tokens = 64;
  l.dtype = "bf16";
  return l;
}

std::vector<kv::ChunkKey> keys(std::uint32_t seed, std::size_t n) {
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
      : service(rules, server::ServerFacts{4 * kSlab, kSlab, false, [] { return 4 * kSlab; }, [] { return 2; }, 0x5eed},
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

Client client(std::uint64_t session, tier::Owner owner) {
  Client c;
  c.session = session;
  c.owner = owner;
  return c;
}

}  // namespace

TEST_CASE("request service: nothing before hello, hello once, and the hello describes the arena", "[server]") {
  Fixture f;
  Client c = client(7, 1);
  Reply early = f.service.handle(c, RegisterLayout{layout()});
  REQUIRE(early.status == Status::bad_request);
  REQUIRE(early.message == "send hello first");
  REQUIRE(f.service.handle(c, Stats{}).status == Status::bad_request);
  Reply hello = f.service.handle(c, Hello{});
  REQUIRE(hello.status == Status::ok);
  const auto& h = std::get<HelloReply>(hello.payload);
  REQUIRE(h.session == 7);
  REQUIRE(h.arena_bytes == 4 * kSlab);
  REQUIRE(h.slab_bytes == kSlab);
  REQUIRE(h.server_id == 0x5eed);  // Hello{} speaks this version: told the server's life
  REQUIRE(f.service.handle(c, Hello{}).status == Status::bad_request);
  // A 2.1 client is not told (its decoder refuses bytes it does not know).
  Client old = client(8, 2);
  const Reply old_hello = f.service.handle(old, Hello{proto::kMajor, 1, "2.1"});
  REQUIRE(std::get<HelloReply>(old_hello.payload).server_id == 0);
}

TEST_CASE("request service: a layout the server cannot serve is refused naming the flag", "[server]") {
  Fixture f;
  Client c = client(1, 1);
  REQUIRE(f.service.handle(c, Hello{}).status == Status::ok);
  kv::Layout other = layout();
  other.chunk_tokens = 128;
  Reply r = f.service.handle(c, RegisterLayout{other});
  REQUIRE(r.status == Status::bad_request);
  REQUIRE(r.message.find("--chunk-tokens") != std::string::npos);
  kv::Layout big = layout();
  big.planes = {{"kv", kSlab}};  // 4 blocks of a slab each: an object of 4 slabs
  r = f.service.handle(c, RegisterLayout{big});
  REQUIRE(r.status == Status::bad_request);
  REQUIRE(r.message.find("--slab-bytes") != std::string::npos);
  REQUIRE(c.regs.empty());
}

TEST_CASE("request service: a registration is its client's own", "[server]") {
  Fixture f;
  Client a = client(1, 1);
  Client b = client(2, 2);
  const std::uint32_t reg = f.start(a);
  const std::uint32_t own = f.start(b);
  REQUIRE(own != reg);
  REQUIRE(f.service.handle(b, Lookup{reg, keys(1, 2)}).status == Status::unknown_registration);
  REQUIRE(f.service.handle(b, Reserve{reg, keys(1, 2), {0, 0}}).status == Status::unknown_registration);
  REQUIRE(f.service.index_of(b, reg) == nullptr);
  REQUIRE(f.service.index_of(a, reg) != nullptr);
}

TEST_CASE("request service: reserve, commit, then another process leases what was committed until it releases it",
          "[server]") {
  Fixture f;
  Client writer = client(1, 1);
  Client reader = client(2, 2);
  const std::uint32_t wreg = f.start(writer);
  const std::uint32_t rreg = f.start(reader);
  f.store(writer, wreg, 1, 3);
  REQUIRE(f.committed_objects == 3);  // handed to each level below to write behind
  REQUIRE(f.far.committed_objects == 3);
  Reply r = f.service.handle(reader, Lookup{rreg, keys(1, 4)});
  REQUIRE(r.status == Status::ok);
  const auto& lk = std::get<LookupReply>(r.payload);
  REQUIRE(lk.hit.tokens == 3 * 64);
  REQUIRE(lk.offsets.size() == 3);
  for (std::uint64_t off : lk.offsets) REQUIRE(off % kObject == 0);
  REQUIRE(f.classes.held_by(2).leases == 1);
  // Only its owner's process releases it: the writer's release is answered
  // as for a lease that never existed, and changes nothing.
  REQUIRE(f.service.handle(writer, Release{lk.lease}).status == Status::unknown_hold);
  REQUIRE(f.classes.held_by(2).leases == 1);
  REQUIRE(f.service.handle(reader, Release{lk.lease}).status == Status::ok);
  REQUIRE(f.classes.held_by(2).leases == 0);
  REQUIRE(f.service.handle(reader, Release{lk.lease}).status == Status::unknown_hold);
}

TEST_CASE("request service: a namespace drop leaves no lookup a hit in the arena, and reaches every level below",
          "[server]") {
  Fixture f;
  Client c = client(1, 1);
  const std::uint32_t reg = f.start(c);
  f.store(c, reg, 1, 3);
  const kv::Digest ns = kv::namespace_of(layout());
  kv::Layout other = layout();
  other.weight_version = "step-2";  // another namespace: untouched
  const std::uint32_t oreg = std::get<RegisterReply>(f.service.handle(c, RegisterLayout{other}).payload).registration;
  std::vector<std::uint32_t> toks(2 * 64, 5);
  const auto other_keys = kv::chunk_keys(other, kv::namespace_of(other), toks);
  const Reply res = f.service.handle(c, Reserve{oreg, other_keys, {0, 0}});
  REQUIRE(f.service.handle(c, Commit{std::get<ReserveReply>(res.payload).reservation, true}).status == Status::ok);

  Reply r = f.service.handle(c, Drop{ns});
  REQUIRE(r.status == Status::ok);
  REQUIRE(std::get<DropReply>(r.payload).arena_objects == 3);
  REQUIRE(std::get<DropReply>(r.payload).lower_objects == 2);  // each fake level says it dropped one
  REQUIRE(f.near.dropped == std::vector<kv::Digest>{ns});
  REQUIRE(f.far.dropped == std::vector<kv::Digest>{ns});
  Reply miss = f.service.handle(c, Lookup{reg, keys(1, 3)});
  REQUIRE(std::get<LookupReply>(miss.payload).hit.tokens == 0);
  REQUIRE(std::get<LookupReply>(miss.payload).lease == 0);
  REQUIRE(std::get<LookupReply>(f.service.handle(c, Lookup{oreg, other_keys}).payload).hit.tokens == 2 * 64);
  // Saved again, it is found again.
  f.store(c, reg, 1, 3);
  REQUIRE(std::get<LookupReply>(f.service.handle(c, Lookup{reg, keys(1, 3)}).payload).hit.tokens == 3 * 64);
}

TEST_CASE("request service: a tenant's drop drops every namespace of its objects, and no other tenant's",
          "[server][tenants]") {
  Fixture f;
  tier::TenantBook book;
  f.classes.set_tenants(&book);
  f.service.set_tenants(&book);
  Client c = client(1, 1);
  REQUIRE(f.service.handle(c, Hello{}).status == Status::ok);
  // Tenant a in two namespaces (two weight versions), tenant b in one.
  auto store_as = [&](const std::string& tenant, const std::string& version, std::uint32_t token) {
    kv::Layout l = layout();
    l.tenant = tenant;
    l.weight_version = version;
    const std::uint32_t reg = std::get<RegisterReply>(f.service.handle(c, RegisterLayout{l}).payload).registration;
    const auto ks = kv::chunk_keys(l, kv::namespace_of(l), std::vector<std::uint32_t>(2 * 64, token));
    const Reply res = f.service.handle(c, Reserve{reg, ks, {0, 0}});
    REQUIRE(f.service.handle(c, Commit{std::get<ReserveReply>(res.payload).reservation, true}).status == Status::ok);
    return std::pair{reg, ks};
  };
  const auto [a1, a1_keys] = store_as("team-a", "", 1);
  const auto [a2, a2_keys] = store_as("team-a", "step-2", 2);
  const auto [b1, b1_keys] = store_as("team-b", "", 1);
  REQUIRE(book.used(*book.id_of("team-a")) == 4 * kObject);

  Reply r = f.service.handle(c, DropTenant{"team-a"});
  REQUIRE(r.status == Status::ok);
  REQUIRE(std::get<DropReply>(r.payload).arena_objects == 4);
  REQUIRE(f.near.dropped.size() == 2);  // each namespace of a's reached the levels below
  REQUIRE(book.used(*book.id_of("team-a")) == 0);
  REQUIRE(std::get<LookupReply>(f.service.handle(c, Lookup{a1, a1_keys}).payload).hit.tokens == 0);
  REQUIRE(std::get<LookupReply>(f.service.handle(c, Lookup{a2, a2_keys}).payload).hit.tokens == 0);
  REQUIRE(std::get<LookupReply>(f.service.handle(c, Lookup{b1, b1_keys}).payload).hit.tokens == 2 * 64);
  // A tenant it never saw drops nothing; a name no tenant can have is refused.
  REQUIRE(std::get<DropReply>(f.service.handle(c, DropTenant{"team-z"}).payload).arena_objects == 0);
  REQUIRE(f.service.handle(c, DropTenant{"team z"}).status == Status::bad_request);
}

TEST_CASE("request service: a lookup's miss is counted by why its first missing chunk is missing", "[server]") {
  Fixture f;
  Client c = client(1, 1);
  const std::uint32_t reg = f.start(c);
  auto misses = [&](const char* reason) {
    const auto& m = f.service.lookup_misses();
    const auto it = m.find(common::labels({{"reason", reason}}));
    return it == m.end() ? 0 : it->second;
  };
  auto look = [&](std::uint32_t r, std::vector<kv::ChunkKey> ks) {
    f.promote(c, Lookup{r, ks});
    Reply rep = f.service.handle(c, Lookup{r, ks});
    REQUIRE(rep.status == Status::ok);
    if (const auto lease = std::get<LookupReply>(rep.payload).lease) REQUIRE(f.service.handle(c, Release{lease}).status == Status::ok);
  };
  // Nothing of another namespace (a new weight version) is here.
  kv::Layout other = layout();
  other.weight_version = "step-2";
  const std::uint32_t oreg = std::get<RegisterReply>(f.service.handle(c, RegisterLayout{other}).payload).registration;
  std::vector<std::uint32_t> toks(64, 3);
  look(oreg, kv::chunk_keys(other, kv::namespace_of(other), toks));
  REQUIRE(misses("other_namespace") == 1);
  // Its namespace holds objects, but never this chunk.
  f.store(c, reg, 1, 2);
  look(reg, keys(1, 3));
  REQUIRE(misses("never_stored") == 1);
  // Pushed out: 4 slabs of 16 objects, prompt 1 stored first, 160 more
  // after it (the clock's hand passes it twice: its first lookup gave it a
  // second chance).
  for (std::uint32_t p = 2; p <= 21; ++p) f.store(c, reg, p, 8);
  look(reg, keys(1, 2));
  REQUIRE(misses("evicted") == 1);
  // The levels below say why they stopped where they had something.
  f.near.why = server::LevelMiss::refused_value;
  look(reg, keys(40, 1));
  REQUIRE(misses("checksum_or_mac") == 1);
  f.near.why = server::LevelMiss::timeout;
  look(reg, keys(40, 1));
  REQUIRE(misses("timeout") == 1);
  f.near.why = server::LevelMiss::none;
  // Dropped here: counted so, not as evicted or never stored.
  REQUIRE(f.service.handle(c, Drop{kv::namespace_of(layout())}).status == Status::ok);
  look(reg, keys(11, 1));
  REQUIRE(misses("dropped") == 1);
  REQUIRE(misses("never_stored") == 1);  // each miss counted once, under one reason
  REQUIRE(misses("evicted") == 1);
  // A whole hit is no miss.
  f.store(c, reg, 41, 1);
  look(reg, keys(41, 1));
  std::uint64_t all = 0;
  for (const auto& [label, n] : f.service.lookup_misses()) all += n;
  REQUIRE(all == 6);
}

TEST_CASE("request service: per-process quotas refuse, typed, and lease or reserve nothing", "[server]") {
  Fixture f(server::ServiceRules{64, 2 * kObject, 3 * kObject});
  Client c = client(1, 1);
  const std::uint32_t reg = f.start(c);
  Reply r = f.service.handle(c, Reserve{reg, keys(1, 4), std::vector<std::uint8_t>(4, 0)});
  REQUIRE(r.status == Status::over_quota);
  REQUIRE(r.message.find("--max-client-reserved") != std::string::npos);
  REQUIRE(f.classes.held_by(1).reservations == 0);
  f.store(c, reg, 1, 3);
  r = f.service.handle(c, Lookup{reg, keys(1, 3)});
  REQUIRE(r.status == Status::over_quota);
  REQUIRE(r.message.find("--max-client-leased") != std::string::npos);
  REQUIRE(f.classes.held_by(1).leases == 0);
  // A lookup whose possible hit fits is served.
  REQUIRE(f.service.handle(c, Lookup{reg, keys(1, 2)}).status == Status::ok);
}

TEST_CASE("request service: quotas count what a request would hold: stored keys and its own lease count nothing more",
          "[server]") {
  Fixture f(server::ServiceRules{64, 2 * kObject, 2 * kObject});
  Client c = client(1, 1);
  const std::uint32_t reg = f.start(c);
  f.store(c, reg, 1, 2);
  // At its reservation quota, it reserves two keys stored already and one new.
  Reply held = f.service.handle(c, Reserve{reg, keys(2, 2), std::vector<std::uint8_t>(2, 0)});
  REQUIRE(held.status == Status::ok);
  Reply r = f.service.handle(c, Reserve{reg, keys(1, 2), std::vector<std::uint8_t>(2, 0)});
  REQUIRE(r.status == Status::ok);  // holds nothing: both exist
  REQUIRE(std::get<ReserveReply>(r.payload).chunks == std::vector<ChunkState>(2, ChunkState::existed));
  REQUIRE(f.service.handle(c, Reserve{reg, keys(3, 1), {0}}).status == Status::over_quota);
  // At its lease quota, it adopts its own lease (a scheduler and its worker in one process).
  Reply l = f.service.handle(c, Lookup{reg, keys(1, 2)});
  REQUIRE(l.status == Status::ok);
  const std::uint64_t lease = std::get<LookupReply>(l.payload).lease;
  r = f.service.handle(c, Adopt{reg, lease, keys(1, 2)});
  REQUIRE(r.status == Status::ok);
  REQUIRE(f.classes.held_by(1).leases == 1);
  REQUIRE(f.classes.held_by(1).leased_bytes == 2 * kObject);
  // And the quota still holds: one more leased chunk is refused.
  REQUIRE(f.service.handle(c, Commit{std::get<ReserveReply>(held.payload).reservation, true}).status == Status::ok);
  REQUIRE(f.service.handle(c, Lookup{reg, keys(2, 1)}).status == Status::over_quota);
}

TEST_CASE("request service: a reserve whose image flags do not match its keys changes nothing", "[server]") {
  Fixture f;
  Client c = client(1, 1);
  const std::uint32_t reg = f.start(c);
  for (std::size_t flags : {std::size_t{1}, std::size_t{3}}) {
    Reply r = f.service.handle(c, Reserve{reg, keys(1, 2), std::vector<std::uint8_t>(flags, 0)});
    REQUIRE(r.status == Status::bad_request);
  }
  REQUIRE(f.classes.held_by(1).reservations == 0);
  REQUIRE(f.classes.stats().writing == 0);
}

TEST_CASE("request service: a lease is adopted once, by a process naming exactly its chunks", "[server]") {
  Fixture f;
  Client sched = client(1, 1);
  Client worker = client(2, 2);
  const std::uint32_t sreg = f.start(sched);
  const std::uint32_t wreg = f.start(worker);
  f.store(sched, sreg, 1, 2);
  const std::uint64_t lease =
      std::get<LookupReply>(f.service.handle(sched, Lookup{sreg, keys(1, 2)}).payload).lease;
  REQUIRE(f.service.handle(worker, Adopt{wreg, lease, keys(2, 2)}).status == Status::unknown_hold);  // other chunks
  Reply r = f.service.handle(worker, Adopt{wreg, lease, keys(1, 2)});
  REQUIRE(r.status == Status::ok);
  REQUIRE(std::get<LookupReply>(r.payload).hit.tokens == 128);
  REQUIRE(f.classes.held_by(2).leases == 1);
  REQUIRE(f.classes.held_by(1).leases == 0);
  REQUIRE(f.service.handle(worker, Adopt{wreg, lease, keys(1, 2)}).status == Status::unknown_hold);  // once
}

TEST_CASE("request service: quotas are per process: more connections, or adopting leases, hold no more", "[server]") {
  Fixture f(server::ServiceRules{64, 2 * kObject, 2 * kObject});
  Client a = client(1, 1);
  Client b = client(2, 1);  // a second connection of the same process
  const std::uint32_t areg = f.start(a);
  const std::uint32_t breg = f.start(b);
  // Reservations: two objects on one connection fill the process's quota.
  Reply held = f.service.handle(a, Reserve{areg, keys(1, 2), std::vector<std::uint8_t>(2, 0)});
  REQUIRE(held.status == Status::ok);
  Reply r = f.service.handle(b, Reserve{breg, keys(2, 1), {0}});
  REQUIRE(r.status == Status::over_quota);
  REQUIRE(f.classes.held_by(1).reservations == 1);
  REQUIRE(f.service.handle(a, Commit{std::get<ReserveReply>(held.payload).reservation, true}).status == Status::ok);
  // Leases: the same.
  REQUIRE(f.service.handle(a, Lookup{areg, keys(1, 2)}).status == Status::ok);
  r = f.service.handle(b, Lookup{breg, keys(1, 1)});
  REQUIRE(r.status == Status::over_quota);
  REQUIRE(f.classes.held_by(1).leases == 1);
  // Another process's lease adopted by this one counts against this one's quota.
  Client other = client(3, 2);
  const std::uint32_t oreg = f.start(other);
  Reply l = f.service.handle(other, Lookup{oreg, keys(1, 1)});
  REQUIRE(l.status == Status::ok);
  r = f.service.handle(b, Adopt{breg, std::get<LookupReply>(l.payload).lease, keys(1, 1)});
  REQUIRE(r.status == Status::over_quota);
  REQUIRE(f.classes.held_by(1).leased_bytes == 2 * kObject);
  REQUIRE(f.classes.held_by(2).leases == 1);  // still the other process's
}

TEST_CASE("request service: a lookup's lease quota counts what its hit pins, not the keys asked", "[server]") {
  Fixture f(server::ServiceRules{64, 2 * kObject, 4 * kObject});
  Client c = client(1, 1);
  const std::uint32_t reg = f.start(c);
  f.store(c, reg, 1, 2);
  // Five keys asked, two stored: the hit pins two objects, within the quota.
  Reply r = f.service.handle(c, Lookup{reg, keys(1, 5)});
  REQUIRE(r.status == Status::ok);
  REQUIRE(std::get<LookupReply>(r.payload).hit.tokens == 128);
  REQUIRE(f.classes.held_by(1).leased_bytes == 2 * kObject);
}

TEST_CASE("request service: a lookup's misses are promoted from each level below in order, each asked only for the "
          "run after what the arena and the levels above hold",
          "[server]") {
  Fixture f;
  Client c = client(1, 1);
  const std::uint32_t reg = f.start(c);
  f.store(c, reg, 1, 2);  // the arena holds the first two chunks of six
  const std::vector<kv::ChunkKey> want = keys(1, 6);
  const auto after = [&](std::size_t n) { return std::vector<kv::ChunkKey>(want.begin() + n, want.end()); };

  f.near.holds = 1;  // the disk has one more, L2 the rest
  f.far.holds = 99;
  f.promote(c, Lookup{reg, want});
  REQUIRE(f.near.asked == std::vector<std::vector<kv::ChunkKey>>{after(2)});
  REQUIRE(f.far.asked == std::vector<std::vector<kv::ChunkKey>>{after(3)});

  // The nearest has the whole run: the farther one is not asked.
  f.near.asked.clear();
  f.far.asked.clear();
  f.near.holds = 99;
  f.promote(c, Lookup{reg, want});
  REQUIRE(f.near.asked.size() == 1);
  REQUIRE(f.far.asked.empty());

  // The arena has it all, or the session is gone, or the registration is
  // not the client's: nobody is asked.
  f.near.asked.clear();
  f.promote(c, Lookup{reg, keys(1, 2)});
  f.promote(c, Lookup{reg, want}, /*gone=*/true);
  Client stranger = client(2, 2);
  f.promote(stranger, Lookup{reg, want});
  REQUIRE(f.near.asked.empty());
  REQUIRE(f.far.asked.empty());
}

TEST_CASE("request service: tenants past --max-tenants are refused naming it, configured ones keep their ids",
          "[server][tenants]") {
  Fixture f;
  // Three tenants at most: the unnamed one, the configured "late", one more.
  tier::TenantBook book({{"late", 2 * kObject}}, tier::TenantBook::kNoQuota, 3);
  f.classes.set_tenants(&book);
  f.service.set_tenants(&book);
  Client c = client(1, 1);
  REQUIRE(f.service.handle(c, Hello{}).status == Status::ok);
  auto register_as = [&](const std::string& tenant) {
    kv::Layout l = layout();
    l.tenant = tenant;
    return f.service.handle(c, RegisterLayout{l});
  };
  REQUIRE(register_as("first").status == Status::ok);
  const std::size_t regs = c.regs.size();
  const Reply refused = register_as("second");
  REQUIRE(refused.status == Status::bad_request);
  REQUIRE(refused.message.find("--max-tenants") != std::string::npos);
  REQUIRE(c.regs.size() == regs);
  REQUIRE(book.size() == 3);
  // A tenant named at start has its id however many came first, and its quota.
  const Reply late = register_as("late");
  REQUIRE(late.status == Status::ok);
  const std::uint32_t reg = std::get<RegisterReply>(late.payload).registration;
  REQUIRE(c.regs.at(reg).tenant == *book.find("late"));
  REQUIRE(book.quota(c.regs.at(reg).tenant) == 2 * kObject);
  // Registered again: the same ids, nothing new.
  REQUIRE(register_as("first").status == Status::ok);
  REQUIRE(book.size() == 3);
}

TEST_CASE("request service: a layout of tiny objects is refused by --min-object-bytes and --max-index-bytes, "
          "naming them",
          "[server]") {
  // A 1-byte object was taken: its first reserve gave it a slab and the
  // index one ~100-byte entry per byte of it.
  server::ServiceRules rules{64, 8 * kObject, 8 * kObject};
  rules.min_object_bytes = 64;
  rules.max_index_bytes = 4 * kSlab / 1024 * tier::Index::bytes_per_slot();  // objects of 1 KiB fit exactly
  Fixture f(rules);
  Client c = client(1, 1);
  REQUIRE(f.service.handle(c, Hello{}).status == Status::ok);
  auto with_plane = [](std::uint64_t bytes, std::uint32_t block_tokens) {
    kv::Layout l = layout();
    l.planes = {{"kv", bytes}};
    l.block_tokens = block_tokens;
    return RegisterLayout{l};
  };
  Reply r = f.service.handle(c, with_plane(1, 64));  // one block a chunk: 1 B objects
  REQUIRE(r.status == Status::bad_request);
  REQUIRE(r.message.find("--min-object-bytes") != std::string::npos);
  r = f.service.handle(c, with_plane(128, 64));  // 128 B objects: past the index bound
  REQUIRE(r.status == Status::bad_request);
  REQUIRE(r.message.find("--max-index-bytes") != std::string::npos);
  REQUIRE(c.regs.empty());
  REQUIRE(f.classes.stats().capacity_bytes == 0);  // no class took a slab for them
  r = f.service.handle(c, with_plane(1024, 64));  // 1 KiB: the index at its bound, served
  REQUIRE(r.status == Status::ok);
}

TEST_CASE("request service: a drop's miss reason remembers the last 65,536 dropped namespaces, not every one",
          "[server]") {
  // Every drop was remembered for the server's life (78 B each, never freed).
  Fixture f;
  Client c = client(1, 1);
  const std::uint32_t reg = f.start(c);
  const kv::Digest first = keys(1, 1)[0].ns;
  REQUIRE(f.service.handle(c, Drop{first}).status == Status::ok);
  (void)f.service.handle(c, Lookup{reg, keys(1, 1)});
  REQUIRE(f.service.lookup_misses().at(common::labels({{"reason", "dropped"}})) == 1);
  for (std::uint32_t i = 0; i < 65536; ++i) {
    kv::Digest other{};
    std::memcpy(other.data(), &i, sizeof i);
    other[31] = std::byte{0x77};
    REQUIRE(f.service.handle(c, Drop{other}).status == Status::ok);
  }
  (void)f.service.handle(c, Lookup{reg, keys(1, 1)});
  REQUIRE(f.service.lookup_misses().at(common::labels({{"reason", "dropped"}})) == 1);  // the first one forgotten
  REQUIRE(f.service.handle(c, Drop{first}).status == Status::ok);   // dropped again: remembered again
  (void)f.service.handle(c, Lookup{reg, keys(1, 1)});
  REQUIRE(f.service.lookup_misses().at(common::labels({{"reason", "dropped"}})) == 2);
}

namespace {
// A registration of `tenant` and keys of its namespace.
std::pair<std::uint32_t, std::vector<kv::ChunkKey>> tenant_reg(RequestService& s, Client& c, const std::string& tenant,
                                                               std::uint32_t token, std::size_t n = 2) {
  kv::Layout l = layout();
  l.tenant = tenant;
  const Reply r = s.handle(c, RegisterLayout{l});
  REQUIRE(r.status == Status::ok);
  return {std::get<RegisterReply>(r.payload).registration,
          kv::chunk_keys(l, kv::namespace_of(l), std::vector<std::uint32_t>(n * 64, token))};
}
}  // namespace

TEST_CASE("request service: another namespace's chunks are a miss, not a registration's to write or adopt",
          "[server][tenants][trust]") {
  Fixture f;
  Client a = client(1, 1), b = client(2, 2);
  REQUIRE(f.service.handle(a, Hello{}).status == Status::ok);
  REQUIRE(f.service.handle(b, Hello{}).status == Status::ok);
  const auto [ra, ka] = tenant_reg(f.service, a, "team-a", 7);
  const auto [rb, kb] = tenant_reg(f.service, b, "team-b", 7);
  const Reply res = f.service.handle(a, Reserve{ra, ka, {0, 0}});
  REQUIRE(f.service.handle(a, Commit{std::get<ReserveReply>(res.payload).reservation, true}).status == Status::ok);

  // b asks for a's chunks: a miss, counted as another namespace's, and the
  // levels below are not asked for them either.
  f.promote(b, Lookup{rb, ka});
  REQUIRE(f.near.asked.empty());
  const LookupReply miss = std::get<LookupReply>(f.service.handle(b, Lookup{rb, ka}).payload);
  REQUIRE(miss.hit.tokens == 0);
  REQUIRE(miss.lease == 0);
  REQUIRE(f.service.lookup_misses().at(common::labels({{"reason", "other_namespace"}})) == 1);
  // Its own keys then a's: the hit stops where a's begin.
  std::vector<kv::ChunkKey> mixed = kb;
  const Reply own = f.service.handle(b, Reserve{rb, kb, {0, 0}});
  REQUIRE(f.service.handle(b, Commit{std::get<ReserveReply>(own.payload).reservation, true}).status == Status::ok);
  mixed.insert(mixed.end(), ka.begin(), ka.end());
  const LookupReply part = std::get<LookupReply>(f.service.handle(b, Lookup{rb, mixed}).payload);
  REQUIRE(part.hit.tokens == 2 * 64);
  REQUIRE(f.service.handle(b, Release{part.lease}).status == Status::ok);
  // Nor may b write into a's namespace, or adopt a's lease of a's chunks.
  const Reply write = f.service.handle(b, Reserve{rb, ka, {0, 0}});
  REQUIRE(write.status == Status::bad_request);
  REQUIRE(write.message.find("namespace") != std::string::npos);
  const LookupReply held = std::get<LookupReply>(f.service.handle(a, Lookup{ra, ka}).payload);
  REQUIRE(held.hit.tokens == 2 * 64);
  REQUIRE(f.service.handle(b, Adopt{rb, held.lease, ka}).status == Status::unknown_hold);
  // a itself still hits in full: its chunks were neither overwritten nor dropped.
  REQUIRE(f.service.handle(a, Release{held.lease}).status == Status::ok);
  REQUIRE(std::get<LookupReply>(f.service.handle(a, Lookup{ra, ka}).payload).hit.tokens == 2 * 64);
}

TEST_CASE("request service: a process bound to a tenant registers as it only, and drops only its own",
          "[server][tenants][trust]") {
  Fixture f;
  tier::TenantBook book;
  f.classes.set_tenants(&book);
  f.service.set_tenants(&book);
  Client a = client(1, 1), b = client(2, 2), admin = client(3, 3);
  a.peer = server::Peer{61001, false, "team-a"};
  b.peer = server::Peer{61002, false, "team-b"};
  for (Client* c : {&a, &b, &admin}) REQUIRE(f.service.handle(*c, Hello{}).status == Status::ok);
  kv::Layout other = layout();
  other.tenant = "team-b";
  const Reply claimed = f.service.handle(a, RegisterLayout{other});
  REQUIRE(claimed.status == Status::not_authorized);
  REQUIRE(claimed.message.find("tenant 'team-a'") != std::string::npos);
  other.tenant.clear();  // no tenant at all is another tenant too
  REQUIRE(f.service.handle(a, RegisterLayout{other}).status == Status::not_authorized);
  const auto [ra, ka] = tenant_reg(f.service, a, "team-a", 1);
  const auto [rb, kb] = tenant_reg(f.service, b, "team-b", 1);
  for (auto [c, r, k] : {std::tuple{&a, ra, ka}, std::tuple{&b, rb, kb}}) {
    const Reply res = f.service.handle(*c, Reserve{r, k, {0, 0}});
    REQUIRE(f.service.handle(*c, Commit{std::get<ReserveReply>(res.payload).reservation, true}).status == Status::ok);
  }
  // b cannot drop a's namespace or tenant; a namespace that exists nowhere is
  // refused the same way (whether a's exists is not b's to learn).
  const Reply theirs = f.service.handle(b, Drop{ka[0].ns});
  const Reply nowhere = f.service.handle(b, Drop{kv::Digest{}});
  REQUIRE(theirs.status == Status::not_authorized);
  REQUIRE(nowhere.status == Status::not_authorized);
  REQUIRE(f.service.handle(b, DropTenant{"team-a"}).status == Status::not_authorized);
  REQUIRE(std::get<LookupReply>(f.service.handle(a, Lookup{ra, ka}).payload).hit.tokens == 2 * 64);
  REQUIRE(f.service.handle(a, Release{std::get<LookupReply>(f.service.handle(a, Lookup{ra, ka}).payload).lease}).status ==
          Status::ok);
  // Its own: yes.
  REQUIRE(f.service.handle(b, Drop{kb[0].ns}).status == Status::ok);
  REQUIRE(f.service.handle(b, DropTenant{"team-b"}).status == Status::ok);
  // The server's user drops anyone's.
  REQUIRE(std::get<DropReply>(f.service.handle(admin, DropTenant{"team-a"}).payload).arena_objects == 2);
  // A client too old to say its weight version cannot be checked: refused.
  Client old = client(4, 4);
  old.peer = a.peer;
  REQUIRE(f.service.handle(old, Hello{2, 4, "old"}).status == Status::ok);
  kv::Layout mine = layout();
  mine.tenant = "team-a";
  REQUIRE(f.service.handle(old, RegisterLayout{mine}).status == Status::not_authorized);
}
