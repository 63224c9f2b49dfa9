// kvstrand-server as a real process, spoken to through protocol 2 by this
// test process: reserve/commit/lookup/release, a full tier, an arena still
// growing, each request's statuses and bounds, per-client quotas, and
// malformed and oversized frames (F25, F27). Tenants: test_server_tenants.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <boost/json.hpp>
#include <catch2/catch.hpp>

#include <filesystem>
#include <cstring>

#include "common/parse_bytes.hpp"
#include "curl.hpp"
#include "protocol_session.hpp"
#include "support.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace kvstrand::proto;
using namespace std::chrono_literals;

TEST_CASE("server: reserve, commit, lookup with a lease: bytes one client wrote another reads (F25)", "[server]") {
  ServerProcess srv(kFlags);
  REQUIRE(srv.ready());
  eventually([&] { return stats(srv.socket_path()).ready_bytes == 16u << 20; }, "every slab ready");
  Client a(srv.socket_path()), b(srv.socket_path());
  int fa = -1, fb = -1;
  REQUIRE(a.hello(&fa)->status == Status::ok);
  REQUIRE(b.hello(&fb)->status == Status::ok);
  Mapped ma(fa, 16u << 20), mb(fb, 16u << 20);
  const std::uint32_t ra = std::get<RegisterReply>(must_call(a, RegisterLayout{layout()}).payload).registration;
  const std::uint32_t rb = std::get<RegisterReply>(must_call(b, RegisterLayout{layout()}).payload).registration;

  const auto ks = keys(1, 3);
  ReserveReply res = reserve(a, ra, ks);
  REQUIRE(res.reservation != 0);
  REQUIRE(res.chunks == std::vector<ChunkState>(3, ChunkState::reserved));
  for (std::size_t i = 0; i < 3; ++i) std::memset(ma.p + res.offsets[i], 0x40 + static_cast<int>(i), kObject);
  REQUIRE(lookup(b, rb, ks).hit.tokens == 0);  // invisible until committed
  REQUIRE(must_call(a, Commit{res.reservation, true}).status == Status::ok);
  REQUIRE(must_call(a, Commit{res.reservation, true}).status == Status::unknown_hold);  // ended

  LookupReply l = lookup(b, rb, keys(1, 4));  // one key more than stored
  REQUIRE(l.hit.tokens == 192);
  REQUIRE(l.hit.checkpoints == std::vector<std::uint32_t>{64, 128, 192});
  REQUIRE(l.lease != 0);
  REQUIRE(l.offsets == res.offsets);
  for (std::size_t i = 0; i < 3; ++i)
    REQUIRE(std::all_of(mb.p + l.offsets[i], mb.p + l.offsets[i] + kObject,
                        [i](std::byte x) { return x == static_cast<std::byte>(0x40 + i); }));
  REQUIRE(stats(srv.socket_path()).leases == 1);
  // Stored keys are not rewritten; an aborted reservation frees its objects.
  ReserveReply again = reserve(a, ra, keys(1, 4));
  REQUIRE(again.chunks == std::vector<ChunkState>{ChunkState::existed, ChunkState::existed, ChunkState::existed,
                                                  ChunkState::reserved});
  REQUIRE(must_call(a, Commit{again.reservation, false}).status == Status::ok);
  const LookupReply second = lookup(b, rb, keys(1, 4));
  REQUIRE(second.hit.tokens == 192);
  REQUIRE(stats(srv.socket_path()).pinned == 3);  // each object pinned twice
  // A lease is released by id from any session of the user (F22), and its
  // release unpins exactly what it pinned, every object of it.
  REQUIRE(must_call(a, Release{l.lease}).status == Status::ok);
  REQUIRE(must_call(b, Release{l.lease}).status == Status::unknown_hold);
  auto st = stats(srv.socket_path());
  REQUIRE(st.leases == 1);
  REQUIRE(st.pinned == 3);  // still the second lease's
  REQUIRE(must_call(a, Release{second.lease}).status == Status::ok);
  st = stats(srv.socket_path());
  REQUIRE(st.leases == 0);
  REQUIRE(st.pinned == 0);  // nothing left waiting for a TTL
}

TEST_CASE("server: a full tier refuses what does not fit with counts, leased objects are never evicted (F25, F27)",
          "[server]") {
  // One 2 MiB slab: 124 objects of 16896 B, all of which one client may hold.
  ServerProcess srv({"--tier-bytes", "2M", "--slab-bytes", "2M", "--chunk-tokens", "64", "--max-client-leased", "2M",
                     "--max-client-reserved", "2M"});
  REQUIRE(srv.ready());
  Client c(srv.socket_path());
  const auto reg = open_session(c);
  eventually([&] { return stats(srv.socket_path()).ready_bytes == 2u << 20; }, "the slab ready");
  const std::uint32_t slots = (2u << 20) / kObject;
  const auto first = keys(1, slots);
  REQUIRE(must_call(c, Commit{reserve(c, reg, first).reservation, true}).status == Status::ok);
  const LookupReply l = lookup(c, reg, first);  // every object leased
  REQUIRE(l.hit.tokens == slots * 64);
  ReserveReply r = reserve(c, reg, keys(2, 2));
  REQUIRE(r.reservation == 0);
  REQUIRE(r.chunks == std::vector<ChunkState>(2, ChunkState::full));
  REQUIRE(stats(srv.socket_path()).refused_full == 2);
  REQUIRE(must_call(c, Release{l.lease}).status == Status::ok);
  r = reserve(c, reg, keys(2, 2));  // LRU objects go now
  REQUIRE(r.chunks == std::vector<ChunkState>(2, ChunkState::reserved));
  REQUIRE(stats(srv.socket_path()).evictions == 2);
}

TEST_CASE("server: a reserve the arena cannot hold yet while its slabs become ready waits for them, never refused full",
          "[server]") {
  // Slabs ready one every 200 ms (a test hook of the server's filler): the
  // first seconds of a server with a large arena, shortened.
  ::setenv("KVSTRAND_TEST_FILL_DELAY_MS", "200", 1);
  ServerProcess srv({"--tier-bytes", "16M", "--slab-bytes", "4M", "--chunk-tokens", "64", "--max-client-reserved",
                     "16M"});
  ::unsetenv("KVSTRAND_TEST_FILL_DELAY_MS");
  REQUIRE(srv.ready());
  Client c(srv.socket_path());
  const auto reg = open_session(c);
  const std::uint32_t per_slab = (4u << 20) / kObject;
  const auto ks = keys(1, 2 * per_slab + 10);  // three slabs' worth
  REQUIRE(stats(srv.socket_path()).ready_bytes < 12u << 20);  // asked before three are ready
  const ReserveReply r = reserve(c, reg, ks);
  REQUIRE(r.chunks == std::vector<ChunkState>(ks.size(), ChunkState::reserved));
  REQUIRE(stats(srv.socket_path()).refused_full == 0);
  REQUIRE(must_call(c, Commit{r.reservation, true}).status == Status::ok);
}

TEST_CASE("server: self-inconsistent and unknown requests get their own status", "[server]") {
  ServerProcess srv(kFlags);
  REQUIRE(srv.ready());
  Client c(srv.socket_path());
  REQUIRE(must_call(c, Ping{}).status == Status::bad_request);  // no hello yet
  const auto reg = open_session(c);
  REQUIRE(must_call(c, Hello{kMajor, kMinor, "twice", {}}).status == Status::bad_request);
  Reply r = must_call(c, Reserve{reg, keys(1, 2), {1}});
  REQUIRE(r.status == Status::bad_request);
  REQUIRE(r.message.find("1 image flags for 2 keys") != std::string::npos);
  REQUIRE(must_call(c, Lookup{reg + 7, keys(1, 1)}).status == Status::unknown_registration);
  REQUIRE(must_call(c, Reserve{reg + 7, keys(1, 1), {0}}).status == Status::unknown_registration);
  REQUIRE(must_call(c, Unregister{999}).status == Status::unknown_registration);
  REQUIRE(must_call(c, Release{12345}).status == Status::unknown_hold);
  REQUIRE(must_call(c, Commit{12345, true}).status == Status::unknown_hold);
  kv::Layout other = layout();
  other.chunk_tokens = 128;
  other.checkpoint.interval_tokens = 128;
  r = must_call(c, RegisterLayout{other});
  REQUIRE(r.status == Status::bad_request);
  REQUIRE(r.message.find("--chunk-tokens") != std::string::npos);
  other = layout();
  other.planes[0].bytes_per_block = 4096;  // another object size: a size class of its own
  r = must_call(c, RegisterLayout{other});
  REQUIRE(r.status == Status::ok);
  REQUIRE(std::get<RegisterReply>(r.payload).object_bytes == other.object_bytes(true));
}

// Every id, count and size a protocol-2 request carries, one value past
// what the server may accept: each refused with its own status, and nothing
// the server holds changes (the index's counts, every byte of the arena).

TEST_CASE("server: every request's bounds, one value past each, are refused and change nothing", "[server]") {
  ServerProcess srv(kFlags);
  REQUIRE(srv.ready());
  eventually([&] { return stats(srv.socket_path()).ready_bytes == 16u << 20; }, "every slab ready");
  Client a(srv.socket_path()), b(srv.socket_path());
  int fa = -1;
  REQUIRE(a.hello(&fa)->status == Status::ok);
  Mapped arena(fa, 16u << 20);
  const auto ra = std::get<RegisterReply>(must_call(a, RegisterLayout{layout()}).payload).registration;
  const auto rb = open_session(b);  // the last registration issued
  // Something stored, a lease and an open reservation: what must not move.
  ReserveReply stored = reserve(a, ra, keys(1, 3));
  for (std::size_t i = 0; i < 3; ++i) std::memset(arena.p + stored.offsets[i], 0x50 + static_cast<int>(i), kObject);
  REQUIRE(must_call(a, Commit{stored.reservation, true}).status == Status::ok);
  const LookupReply lease = lookup(a, ra, keys(1, 3));
  const ReserveReply open = reserve(a, ra, keys(2, 1));
  // Hold ids are random (48 bits under the size class): one past the
  // largest is as unknown as any other id.
  const std::uint64_t last_hold = std::max(lease.lease, open.reservation);

  auto held = [&] {
    const StatsReply st = stats(srv.socket_path());
    std::uint64_t sum = 0;  // every byte of the arena, position-weighted
    const auto* w = reinterpret_cast<const std::uint64_t*>(arena.p);
    for (std::uint64_t i = 0; i < (16u << 20) / 8; ++i) sum = sum * 1099511628211ull + w[i];
    return std::vector<std::uint64_t>{st.used_bytes, st.objects, st.pinned, st.leases, st.reservations,
                                      st.refused_full, st.evictions, sum};
  };
  const auto before = held();

  kv::Layout wide = layout();
  wide.chunk_tokens = 128;
  wide.checkpoint.interval_tokens = 128;
  kv::Layout past_slab = layout();
  past_slab.planes = {{"k", 1048575}};
  past_slab.checkpoint.image_bytes = 5;  // 4 x 1048575 + 5: one byte more than a 4 MiB slab
  kv::Layout broken = layout();
  broken.block_tokens = 0;
  struct Case {
    const char* what;
    Client* on;
    Request req;
    Status status;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"hello twice", &a, Hello{kMajor, kMinor, "again", {}}, Status::bad_request, "hello was already said"},
      {"register: another chunk size", &a, RegisterLayout{wide}, Status::bad_request, "--chunk-tokens"},
      {"register: an object one byte past a slab", &a, RegisterLayout{past_slab}, Status::bad_request,
       "--slab-bytes"},
      {"register: an invalid layout", &a, RegisterLayout{broken}, Status::bad_request, "block_tokens"},
      {"unregister: one past the last registration", &a, Unregister{rb + 1}, Status::unknown_registration, ""},
      {"unregister: another session's registration", &a, Unregister{rb}, Status::unknown_registration, ""},
      {"lookup: one past the last registration", &a, Lookup{rb + 1, keys(1, 1)}, Status::unknown_registration, ""},
      {"lookup: another session's registration", &b, Lookup{ra, keys(1, 1)}, Status::unknown_registration, ""},
      {"reserve: one past the last registration", &a, Reserve{rb + 1, keys(3, 1), {1}}, Status::unknown_registration,
       ""},
      {"reserve: another session's registration", &b, Reserve{ra, keys(3, 1), {1}}, Status::unknown_registration, ""},
      {"reserve: one image flag more than keys", &a, Reserve{ra, keys(3, 2), {1, 1, 1}}, Status::bad_request,
       "3 image flags for 2 keys"},
      {"reserve: one image flag fewer than keys", &a, Reserve{ra, keys(3, 2), {1}}, Status::bad_request,
       "1 image flags for 2 keys"},
      {"release: one past the last hold", &a, Release{last_hold + 1}, Status::unknown_hold, ""},
      {"release: hold 0", &a, Release{0}, Status::unknown_hold, ""},
      {"commit: one past the last hold", &a, Commit{last_hold + 1, true}, Status::unknown_hold, ""},
      {"commit: a lease is not a reservation", &a, Commit{lease.lease, true}, Status::unknown_hold, ""},
      {"commit: an aborting commit of a lease", &a, Commit{lease.lease, false}, Status::unknown_hold, ""},
      {"adopt: one past the last registration", &a, Adopt{rb + 1, lease.lease, keys(1, 3)},
       Status::unknown_registration, ""},
      {"adopt: another session's registration", &b, Adopt{ra, lease.lease, keys(1, 3)}, Status::unknown_registration,
       ""},
      {"adopt: one past the last hold", &b, Adopt{rb, last_hold + 1, keys(1, 3)}, Status::unknown_hold, ""},
      {"adopt: a reservation is not a lease", &b, Adopt{rb, open.reservation, keys(2, 1)}, Status::unknown_hold, ""},
      {"adopt: one chunk fewer than the lease holds", &b, Adopt{rb, lease.lease, keys(1, 2)}, Status::unknown_hold,
       ""},
      {"adopt: other chunks than the lease holds", &b, Adopt{rb, lease.lease, keys(4, 3)}, Status::unknown_hold,
       "holds other chunks"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    const Reply r = must_call(*c.on, c.req);
    REQUIRE(r.status == c.status);
    REQUIRE(r.message.find(c.says) != std::string::npos);
    REQUIRE(held() == before);
  }
  // The last value inside each bound is served.
  REQUIRE(lookup(b, rb, keys(1, 3)).hit.tokens == 192);
  REQUIRE(must_call(a, Commit{open.reservation, true}).status == Status::ok);
  REQUIRE(must_call(a, Release{lease.lease}).status == Status::ok);
  // An ended hold or registration is past its bound too.
  REQUIRE(must_call(a, Release{lease.lease}).status == Status::unknown_hold);
  REQUIRE(must_call(a, Commit{open.reservation, true}).status == Status::unknown_hold);
  REQUIRE(must_call(a, Unregister{ra}).status == Status::ok);
  REQUIRE(must_call(a, Lookup{ra, keys(1, 1)}).status == Status::unknown_registration);
}

TEST_CASE("server: an object one byte past a slab is refused at registration, one that fills it is served",
          "[server]") {
  // 4 blocks of 1048575 B and a 4 B image: exactly one 4 MiB slab.
  auto sized = [](std::uint32_t image) {
    kv::Layout l = layout();
    l.planes = {{"k", 1048575}};
    l.checkpoint.image_bytes = image;
    return l;
  };
  REQUIRE(sized(4).object_bytes(true) == 4u << 20);
  ServerProcess srv(kFlags);
  REQUIRE(srv.ready());
  Client c(srv.socket_path());
  REQUIRE(must_call(c, Hello{kMajor, kMinor, "slab", {}}).status == Status::ok);
  const Reply past = must_call(c, RegisterLayout{sized(5)});
  REQUIRE(past.status == Status::bad_request);
  REQUIRE(past.message.find("--slab-bytes") != std::string::npos);
  const Reply fits = must_call(c, RegisterLayout{sized(4)});
  INFO(fits.message);
  REQUIRE(fits.status == Status::ok);
  REQUIRE(std::get<RegisterReply>(fits.payload).object_bytes == 4u << 20);
}

TEST_CASE("server: per-process bounds on leased and reserved bytes are typed refusals", "[server]") {
  ServerProcess srv({"--tier-bytes", "16M", "--slab-bytes", "4M", "--chunk-tokens", "64", "--max-client-leased",
                     std::to_string(2 * kObject), "--max-client-reserved", std::to_string(3 * kObject)});
  REQUIRE(srv.ready());
  Client c(srv.socket_path());
  const auto reg = open_session(c);
  eventually([&] { return stats(srv.socket_path()).ready_bytes > 0; }, "a slab ready");
  Reply r = must_call(c, Reserve{reg, keys(1, 4), std::vector<std::uint8_t>(4, 0)});
  REQUIRE(r.status == Status::over_quota);
  REQUIRE(r.message.find("--max-client-reserved") != std::string::npos);
  REQUIRE(stats(srv.socket_path()).reservations == 0);  // nothing held
  const auto res = reserve(c, reg, keys(1, 3));
  REQUIRE(must_call(c, Commit{res.reservation, true}).status == Status::ok);
  r = must_call(c, Lookup{reg, keys(1, 3)});
  REQUIRE(r.status == Status::over_quota);
  REQUIRE(r.message.find("--max-client-leased") != std::string::npos);
  REQUIRE(lookup(c, reg, keys(1, 2)).lease != 0);  // within the bound
  REQUIRE(stats(srv.socket_path()).leases == 1);
}

TEST_CASE("server: connections announcing maximal bodies do not grow the server by their announced sizes",
          "[server][fault]") {
  ServerProcess srv(kFlags);
  REQUIRE(srv.ready());
  const std::uint64_t before = resident_bytes(srv.pid());
  REQUIRE(before > 0);
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 16; ++i) {
    clients.push_back(std::make_unique<Client>(srv.socket_path()));
    REQUIRE(clients.back()->call(Hello{kMajor, kMinor, "big", {}}).has_value());
    Header h;
    h.type = static_cast<std::uint16_t>(Type::lookup);
    h.request_id = 2;
    h.body_bytes = kDefaultMaxBody;  // 16 MiB announced...
    auto head = encode_header(h);
    std::vector<std::byte> frame(head.begin(), head.end());
    frame.resize(frame.size() + 1000, std::byte{1});  // ...1000 bytes sent
    REQUIRE(clients.back()->send_raw(frame));
  }
  std::this_thread::sleep_for(300ms);
  const std::uint64_t after = resident_bytes(srv.pid());
  INFO("resident before " << before << " B, after " << after << " B");
  REQUIRE(after < before + (16u << 20));  // 16 x 16 MiB announced would be 256 MiB
  REQUIRE(stats(srv.socket_path()).sessions >= 17);  // and it still serves
}

TEST_CASE("server: malformed frames get an error reply or a closed connection, protocol 1 is refused readably",
          "[server][fault]") {
  ServerProcess srv({"--tier-bytes", "16M", "--slab-bytes", "4M", "--chunk-tokens", "64", "--max-frame", "64K"});
  REQUIRE(srv.ready());
  {
    Client c(srv.socket_path());
    REQUIRE(must_call(c, Hello{kMajor, kMinor, "t", {}}).status == Status::ok);
    Header h;
    h.type = static_cast<std::uint16_t>(Type::reserve);
    h.request_id = 5;
    h.body_bytes = 7;
    auto head = encode_header(h);
    std::vector<std::byte> frame(head.begin(), head.end());
    frame.resize(frame.size() + 7, std::byte{0xee});  // a body that does not decode
    REQUIRE(c.send_raw(frame));
    auto rep = c.read_reply(5);
    REQUIRE(rep.has_value());
    REQUIRE(rep->status == Status::bad_request);
    REQUIRE(must_call(c, Ping{}).status == Status::ok);  // the connection still works
  }
  {
    Client c(srv.socket_path());
    REQUIRE(c.send_raw(std::vector<std::byte>(40, std::byte{'x'})));  // not a frame
    REQUIRE(c.closed_by_server());
  }
  {
    Client c(srv.socket_path());
    Header h;
    h.type = static_cast<std::uint16_t>(Type::ping);
    h.body_bytes = 1u << 20;  // over --max-frame
    auto head = encode_header(h);
    REQUIRE(c.send_raw({head.begin(), head.end()}));
    REQUIRE(c.closed_by_server());
  }
  {
    // A protocol 1 client's store: the refusal comes in protocol 1's header,
    // for its own request type, so that client can read why.
    Client c(srv.socket_path());
    Header h;
    h.major = 1;
    h.type = 6;  // protocol 1's store
    h.request_id = 9;
    auto head = encode_header(h);
    REQUIRE(c.send_raw({head.begin(), head.end()}));
    std::array<std::byte, kHeaderBytes> back{};
    REQUIRE(c.read_exact(back.data(), back.size()));
    REQUIRE(static_cast<std::uint8_t>(back[4]) == 1);  // major 1
    REQUIRE((static_cast<std::uint16_t>(back[6]) | static_cast<std::uint16_t>(back[7]) << 8) == (6 | kReplyBit));
    std::uint32_t n = 0;
    std::memcpy(&n, back.data() + 16, 4);
    std::vector<std::byte> body(n);
    REQUIRE(c.read_exact(body.data(), n));
    auto rep = decode_reply(6 | kReplyBit, body);  // status and message: the same encoding in 1 and 2
    REQUIRE(rep.has_value());
    REQUIRE(rep->status == Status::refused_version);
    REQUIRE(rep->message.find("protocol 1") != std::string::npos);
    REQUIRE(c.closed_by_server());
  }
  REQUIRE(stats(srv.socket_path()).sessions >= 1);  // still serving
}

TEST_CASE("server: /debug/holds and /debug/sessions list at most 1000, /debug/tier counts them all",
          "[server][http]") {
  if (!curl_present()) return;
  // 30,000 leases and 100 processes took 268 ms of the strand for one
  // /debug/holds (a pass over the processes for every hold), lookups
  // waiting behind it: a page's work is bounded now, whatever clients hold.
  const auto port = free_port();
  ServerProcess srv({"--tier-bytes", "64M", "--slab-bytes", "16M", "--chunk-tokens", "64", "--max-client-reserved",
                     "60M", "--http", "127.0.0.1:" + std::to_string(port)});
  REQUIRE(srv.ready());
  Client c(srv.socket_path());
  const auto reg = open_session(c);
  eventually([&] { return stats(srv.socket_path()).ready_bytes == 64u << 20; }, "every slab ready");
  for (std::uint64_t i = 0; i < 1100; ++i) REQUIRE(reserve(c, reg, keys(1000 + i, 1)).reservation != 0);
  REQUIRE(stats(srv.socket_path()).reservations == 1100);
  const auto holds = boost::json::parse(curl(port, "/debug/holds").body).as_array();
  REQUIRE(holds.size() == 1000);
  REQUIRE(holds[0].at("pid").to_number<int>() == ::getpid());
  const auto tier = boost::json::parse(curl(port, "/debug/tier").body);
  REQUIRE(tier.at("reservations").to_number<int>() == 1100);
  const auto sessions = boost::json::parse(curl(port, "/debug/sessions").body).as_array();
  REQUIRE(sessions.size() == 1);
  REQUIRE(sessions[0].at("process_reservations").to_number<int>() == 1100);
}

TEST_CASE("server: a hold is its maker's: another process's release or commit is answered as an unknown hold",
          "[server][tenants]") {
  // Any session could release, commit or abort any hold, and ids were
  // consecutive: a second process committed the first's unwritten
  // reservation (a reader then served bytes never written), or released its
  // lease by guessing its own id + 1.
  ServerProcess srv({"--tier-bytes", "16M", "--slab-bytes", "4M", "--chunk-tokens", "64"});
  REQUIRE(srv.ready());
  Client a(srv.socket_path());
  const auto reg = open_session(a);
  eventually([&] { return stats(srv.socket_path()).ready_bytes > 0; }, "a slab ready");
  const ReserveReply unwritten = reserve(a, reg, keys(1, 2));
  const ReserveReply stored = reserve(a, reg, keys(2, 2));
  REQUIRE(must_call(a, Commit{stored.reservation, true}).status == Status::ok);
  const LookupReply lease = lookup(a, reg, keys(2, 2));
  REQUIRE(lease.lease != 0);
  // Ids say nothing of one another: not consecutive.
  REQUIRE(lease.lease != stored.reservation + 1);
  REQUIRE(unwritten.reservation + 1 != stored.reservation);

  // Another process (forked: its own pid, its own connection).
  const pid_t child = ::fork();
  if (child == 0) {
    int code = 0;
    {
      Client b(srv.socket_path());
      if (b.call(Hello{kMajor, kMinor, "b", {}})->status != Status::ok) code = 10;
      const auto commit = b.call(Commit{unwritten.reservation, true});
      const auto release = b.call(Release{lease.lease});
      const auto abort = b.call(Release{unwritten.reservation});
      const auto never = b.call(Release{unwritten.reservation ^ 0x5555});
      if (!commit || commit->status != Status::unknown_hold) code = 11;
      if (!release || release->status != Status::unknown_hold) code = 12;
      if (!abort || abort->status != Status::unknown_hold) code = 13;
      // Exactly what an id that never existed gets, but for the id in it.
      if (!never || release->message.substr(0, 24) != never->message.substr(0, 24)) code = 14;
    }
    ::_exit(code);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  // Still a's: nothing committed, released or aborted by b.
  const auto st = stats(srv.socket_path());
  REQUIRE(st.reservations == 1);
  REQUIRE(st.leases == 1);
  REQUIRE(lookup(a, reg, keys(1, 2)).hit.tokens == 0);  // the unwritten chunks were never published
  REQUIRE(must_call(a, Release{lease.lease}).status == Status::ok);
  REQUIRE(must_call(a, Commit{unwritten.reservation, false}).status == Status::ok);
}
