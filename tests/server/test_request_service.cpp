// kvstrand-server's request rules without a socket: the order a client must
// follow, its own registrations, its quotas, and what each request does to
// the index (test_server runs the same through real processes). Tenants:
// test_request_service_tenants.
#include <unistd.h>

#include <boost/asio/strand.hpp>
#include <cstring>
#include <string>

#include "request_service_rig.hpp"
#include "server/events/kv_event_codec.hpp"
#include "server/events/msgpack.hpp"
#include "server/events/tier_events.hpp"

using namespace kvstrand;
using namespace kvstrand::test;


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
  const Reply old_hello = f.service.handle(old, Hello{proto::kMajor, 1, "2.1", {}});
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
  // A reserve says where each reserved chunk goes: a place of its own each.
  {
    const Reply res = f.service.handle(writer, Reserve{wreg, keys(7, 2), {0, 0}});
    REQUIRE(res.status == Status::ok);
    const auto& rr = std::get<ReserveReply>(res.payload);
    REQUIRE(rr.offsets.size() == 2);
    REQUIRE(rr.offsets[0] != rr.offsets[1]);
    for (std::uint64_t off : rr.offsets) REQUIRE(off % kObject == 0);
    REQUIRE(f.service.handle(writer, Commit{rr.reservation, false}).status == Status::ok);
  }
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
  const LookupReply looked = std::get<LookupReply>(f.service.handle(sched, Lookup{sreg, keys(1, 2)}).payload);
  const std::uint64_t lease = looked.lease;
  REQUIRE(f.service.handle(worker, Adopt{wreg, lease, keys(2, 2)}).status == Status::unknown_hold);  // other chunks
  Reply r = f.service.handle(worker, Adopt{wreg, lease, keys(1, 2)});
  REQUIRE(r.status == Status::ok);
  REQUIRE(std::get<LookupReply>(r.payload).hit.tokens == 128);
  // The adopter is told where the objects are: the lookup's places.
  REQUIRE(std::get<LookupReply>(r.payload).offsets == looked.offsets);
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

TEST_CASE("request service: with --events a committed chunk's slot keeps BlockRemoved's part of its description, "
          "with levels below or none",
          "[server][events]") {
  server::msgpack::Writer w;
  w.map(3);
  w.str("block_hashes");
  w.array(1);
  w.uint(42);
  w.str("token_ids");
  w.array(64);
  for (int t = 0; t < 64; ++t) w.uint(1000 + t);
  w.str("block_size");
  w.uint(16);
  const std::string description = w.take();
  const std::string part = server::removal_part(description).value();
  for (const bool below : {false, true}) {
    boost::asio::io_context io;
    server::EventOptions o;
    o.endpoint = "ipc:///tmp/kvstrand-test-request-events-" + std::to_string(::getpid());
    auto p = server::EventPublisher::open(boost::asio::make_strand(io), o);
    REQUIRE(p.has_value());
    {
      tier::SizeClasses classes{kSlab};
      FakeLevel level;
      server::TierEvents events(*p);
      events.watch(classes, "CPU");
      RequestService service({64, 8 * kObject, 8 * kObject},
                             server::ServerFacts{4 * kSlab, kSlab, false, [] { return 4 * kSlab; }, [] { return 2; },
                                                 0x5eed, {}},
                             classes, below ? std::vector<server::LowerLevel*>{&level} : std::vector<server::LowerLevel*>{});
      for (std::uint32_t s = 0; s < 4; ++s) classes.add_slab(s);
      service.set_events(&events);
      Client c = client(1, 1);
      REQUIRE(service.handle(c, Hello{}).status == Status::ok);
      const Reply reg = service.handle(c, RegisterLayout{layout()});
      REQUIRE(reg.status == Status::ok);
      const Reply r = service.handle(c, Reserve{std::get<RegisterReply>(reg.payload).registration, keys(3, 1), {0},
                                                {description}});
      REQUIRE(r.status == Status::ok);
      CHECK(events.descriptions().bytes() == description.size());  // whole until its BlockStored is out
      REQUIRE(service.handle(c, Commit{std::get<ReserveReply>(r.payload).reservation, true}).status == Status::ok);
      CHECK((*p)->stats().stored == 1);
      CHECK(events.descriptions().size() == 1);
      CHECK(events.descriptions().bytes() == part.size());
      CHECK(level.committed_objects == (below ? 1u : 0u));
    }
    ::unlink(o.endpoint.substr(6).c_str());
  }
}
