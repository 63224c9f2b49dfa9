// kvstrand-server's request rules for tenants, without a socket: a tenant's
// drop, --max-tenants, hits and writes within a registration's namespace
// only, and a process the kernel binds to a tenant (test_server_tenants runs
// the same through real processes of other users).
#include <tuple>

#include "request_service_rig.hpp"

using namespace kvstrand;
using namespace kvstrand::test;

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
  REQUIRE(f.service.handle(old, Hello{2, 4, "old", {}}).status == Status::ok);
  kv::Layout mine = layout();
  mine.tenant = "team-a";
  REQUIRE(f.service.handle(old, RegisterLayout{mine}).status == Status::not_authorized);
}
