// kvstrand-server with --disk, on a real file system (a directory beside the
// test binary): what the arena commits is written behind to the disk; what
// the arena evicted comes back from it byte for byte; a restarted server
// finds its disk's objects; a flipped byte or a torn header is a counted
// miss, never a load; failing and slow disks (the KVSTRAND_TEST_DISK_FAULT
// hook) never delay a reply past --disk-timeout nor stop the arena serving.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <stdlib.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <thread>
#include <filesystem>
#include <fstream>
#include <map>

#include "disk_node.hpp"
#include "tier/object_header.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;

namespace {

// 20 prompts of 50 chunks: 1000 objects, more than the arena's 816, so the
// first ones are evicted from it; each written to disk before the next.
void store_past_the_arena(Node& n) {
  n.store_written(1, 20, 50);
  REQUIRE(n.metric("evictions_total") > 0);
}

// The disk offset of the header block of prompt `seed`'s chunk `i`.
std::uint64_t header_of(const std::string& file, int seed, std::size_t i) {
  const kv::ChunkKey want = keys(seed, static_cast<std::uint32_t>(i + 1))[i];
  const int fd = ::open(file.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  std::vector<std::byte> block(4096);
  for (std::uint64_t off = 0; ::pread(fd, block.data(), block.size(), static_cast<off_t>(off)) == 4096; off += 4096) {
    auto h = tier::read_object_header(block);
    if (h && h->key == want) {
      ::close(fd);
      return off;
    }
  }
  ::close(fd);
  FAIL("no header of prompt " << seed << " chunk " << i << " on the disk");
  return 0;
}

void flip_byte(const std::string& file, std::uint64_t at) {
  const int fd = ::open(file.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  std::byte b{};
  REQUIRE(::pread(fd, &b, 1, static_cast<off_t>(at)) == 1);
  b ^= std::byte{0x20};
  REQUIRE(::pwrite(fd, &b, 1, static_cast<off_t>(at)) == 1);
  ::close(fd);
}

// Copies a slot (its header block and its object) over another.
void copy_slot(const std::string& file, std::uint64_t from, std::uint64_t to) {
  const int fd = ::open(file.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  std::vector<std::byte> slot(4096 + (kObject + 4095) / 4096 * 4096);
  REQUIRE(::pread(fd, slot.data(), slot.size(), static_cast<off_t>(from)) == static_cast<ssize_t>(slot.size()));
  REQUIRE(::pwrite(fd, slot.data(), slot.size(), static_cast<off_t>(to)) == static_cast<ssize_t>(slot.size()));
  ::close(fd);
}

}  // namespace

TEST_CASE("disk: what the arena evicted is read back from the disk byte for byte, and stays on it",
          "[disk][server]") {
  DiskDir d;
  Node n(d);
  store_past_the_arena(n);
  REQUIRE(n.disk("objects") == 1000);
  REQUIRE(n.disk("write_dropped_total") == 0);
  // Prompt 1 left the arena: the lookup promotes it whole from the disk.
  REQUIRE(n.load(1, 50) == 50);
  REQUIRE(n.disk("promoted_total") == 50);
  REQUIRE(n.disk("lookups_total") >= 1);
  // The last prompt is in the arena: no disk read for it.
  REQUIRE(n.load(20, 50) == 50);
  REQUIRE(n.disk("promoted_total") == 50);
  // Promoted objects are not written again.
  REQUIRE(n.disk("written_total") == 1000);
  // Every prompt loads exactly, wherever it is now.
  for (int p = 1; p <= 20; ++p) REQUIRE(n.load(p, 50) == 50);
  REQUIRE(n.disk("checksum_failures_total") == 0);
  REQUIRE(n.metric("disk_errors_total{op=\"read\"}") == 0);
}

TEST_CASE("disk: a restarted server finds its disk's objects and loads them exactly", "[disk][server][fault]") {
  DiskDir d;
  Node n(d);
  n.store_written(1, 4, 50);
  n.restart(d);  // SIGKILL: the memfd arena is gone, the disk is not
  REQUIRE(n.disk("recovered_objects_total") == 200);
  REQUIRE(n.disk("objects") == 200);
  for (int p = 1; p <= 4; ++p) REQUIRE(n.load(p, 50) == 50);
  REQUIRE(n.disk("promoted_total") == 200);
  // A prompt it never had is a miss, not an error.
  REQUIRE(n.load(99, 4) == 0);
  REQUIRE(n.disk("lookup_misses_total") >= 1);
}

TEST_CASE("disk: after a namespace drop no lookup hits the old objects, from the arena or the disk", "[disk][server]") {
  DiskDir d;
  Node n(d);
  store_past_the_arena(n);  // prompt 1 is on the disk only, prompt 20 in the arena too
  Reply r = must_call(*n.c, Drop{kv::namespace_of(layout())});
  REQUIRE(r.status == Status::ok);
  REQUIRE(std::get<DropReply>(r.payload).arena_objects > 0);
  REQUIRE(std::get<DropReply>(r.payload).lower_objects == 1000);
  REQUIRE(n.metric("dropped_objects_total") == static_cast<double>(std::get<DropReply>(r.payload).arena_objects));
  REQUIRE(n.load(1, 50) == 0);   // not promoted from the disk
  REQUIRE(n.load(20, 50) == 0);  // not in the arena
  REQUIRE(n.metric("lookup_misses_total{reason=\"dropped\"}") == 2);
  REQUIRE(n.disk("objects") == 0);
  // Nor after a restart: the dropped objects' headers were cleared.
  eventually([&] { return n.disk("in_flight") == 0; }, "the cleared headers are written");
  n.restart(d);
  REQUIRE(n.disk("recovered_objects_total") == 0);
  REQUIRE(n.disk("recovery_dropped_total") == 0);
  REQUIRE(n.load(1, 50) == 0);
  // Stored again, it is written and found again, across a restart too.
  n.store_written(1, 1, 50);
  REQUIRE(n.load(1, 50) == 50);
  n.restart(d);
  REQUIRE(n.disk("recovered_objects_total") == 50);
  REQUIRE(n.load(1, 50) == 50);
}

TEST_CASE("disk: a flipped byte in an object, a torn header or another chunk in its slot is a counted miss, never "
          "loaded",
          "[disk][server][fault]") {
  DiskDir d;
  Node n(d);
  for (int p = 1; p <= 3; ++p) n.store(p, 10);
  n.written(30);
  // Prompt 1, chunk 4: one bit of its bytes (then the arena, which has it, is gone).
  flip_byte(d.file(), header_of(d.file(), 1, 4) + 4096 + 1234);
  const std::uint64_t torn = header_of(d.file(), 2, 0);
  n.restart(d);
  REQUIRE(n.disk("recovered_objects_total") == 30);
  // The payload is checked when read: prompt 1 stops before chunk 4.
  REQUIRE(n.load(1, 10) == 4);
  REQUIRE(n.disk("checksum_failures_total") == 1);
  REQUIRE(n.metric("lookup_misses_total{reason=\"checksum_or_mac\"}") == 1);
  // ... and the bad object is gone from the disk: asked again, a miss at
  // once, not a second failure.
  REQUIRE(n.load(1, 10) == 4);
  REQUIRE(n.disk("checksum_failures_total") == 1);
  REQUIRE(n.load(3, 10) == 10);
  // A torn header (prompt 2, chunk 0) is dropped when the disk is read at start.
  flip_byte(d.file(), torn + 70);
  n.restart(d);
  REQUIRE(n.disk("recovery_dropped_total") == 1);
  REQUIRE(n.load(2, 10) == 0);
  // A slot rewritten, after the server read its header, with another
  // chunk's whole object (a valid header of its own): a miss, not that chunk.
  copy_slot(d.file(), header_of(d.file(), 3, 1), header_of(d.file(), 3, 5));
  REQUIRE(n.load(3, 10) == 5);
  REQUIRE(n.disk("checksum_failures_total") == 1);
}

TEST_CASE("disk: writes failing with EIO or ENOSPC are counted, replies never wait, the arena keeps serving",
          "[disk][server][fault]") {
  const char* fault = GENERATE("write-eio", "write-enospc");
  INFO(fault);
  DiskDir d;
  Fault f(fault);
  Node n(d);
  for (int p = 1; p <= 4; ++p) n.store(p, 50);
  // Every object's write failed, counted (and the extents' headers' too),
  // or was dropped, counted, when the queue was full (a disk thread that
  // lags behind the saves, as on a loaded machine).
  char seen[160] = "";
  eventually(
      [&] {
        const double errors = n.metric("disk_errors_total{op=\"write\"}"), dropped = n.disk("write_dropped_total"),
                     queued = n.disk("write_queue"), running = n.disk("in_flight");
        std::snprintf(seen, sizeof seen, "every write failed or was dropped, counted: %.0f failed, %.0f dropped, %.0f "
                      "queued, %.0f in flight", errors, dropped, queued, running);
        return errors > 0 && errors + dropped >= 200 && queued == 0 && running == 0;
      },
      seen);
  REQUIRE(n.disk("objects") == 0);
  REQUIRE(n.disk("written_total") == 0);
  for (int p = 1; p <= 4; ++p) REQUIRE(n.load(p, 50) == 50);
  // Nothing stays pinned by a failed write: the arena still evicts to take more.
  for (int p = 5; p <= 20; ++p) n.store(p, 50);
  REQUIRE(n.load(20, 50) == 50);
}

TEST_CASE("disk: a disk slower than the saves pins at most an eighth of the arena: saves are never refused, what "
          "does not fit is dropped and counted",
          "[disk][server][fault]") {
  DiskDir d;
  Fault f("delay-ms=300");
  Node n(d);
  // 1000 objects committed far faster than the disk takes them; the queue
  // (--disk-queue 1024 objects) would hold every one of the arena's 816.
  for (int p = 1; p <= 20; ++p) n.store(p, 50);  // each reserve requires every chunk reserved
  REQUIRE(n.disk("write_dropped_total") > 0);
  REQUIRE(n.load(20, 50) == 50);
  // Every object queued is written in the end, and nothing more stays pinned.
  eventually([&] { return n.disk("write_queue") == 0 && n.disk("in_flight") == 0; }, "the queue drained");
  REQUIRE(n.disk("written_total") + n.disk("write_dropped_total") == 1000);
}

TEST_CASE("disk: reads failing with EIO are misses, counted, and never load a byte", "[disk][server][fault]") {
  DiskDir d;
  {
    Node n(d);
    n.store(1, 50);
    n.written(50);
  }
  Fault f("read-eio,delay-ms=100");  // a slow disk too, as on a loaded host
  Node n(d);  // its start reads no header either: it starts with an empty disk index
  REQUIRE(n.disk("recovered_objects_total") == 0);
  n.store_written(1, 4, 50);
  // Prompts 1.. leave the arena. Each written before the next: a write the
  // queue dropped leaves its object unreferenced, and the hand would evict
  // such objects of prompts 5.. before prompt 1.
  n.store_written(5, 20, 50);
  REQUIRE(n.load(1, 50) == 0);
  REQUIRE(n.metric("disk_errors_total{op=\"read\"}") >= 1);
  REQUIRE(n.disk("promoted_total") == 0);
  REQUIRE(n.load(20, 50) == 50);
}

TEST_CASE("disk: a slow disk: a lookup answers by --disk-timeout, other sessions are served meanwhile, and the "
          "reads still commit for the next lookup",
          "[disk][server][fault]") {
  DiskDir d;
  {
    Node n(d);
    store_past_the_arena(n);
  }
  Fault f("delay-ms=1500");
  Node n(d, {"--disk-timeout", "200"});
  REQUIRE(n.disk("recovered_objects_total") == 1000);
  for (int p = 21; p <= 24; ++p) n.store(p, 10);  // in the arena
  n.written(40);  // (the reads to come would queue behind these writes, and be dropped at the timeout)
  // Another session's lookups of what the arena holds, while prompt 1 is read.
  std::atomic<bool> done{false};
  std::atomic<int> other_hits{0};
  Client c2(n.srv.socket_path());
  const std::uint32_t reg2 = open_session(c2);
  const auto keys21 = keys(21, 10);
  std::thread other([&] {  // no Catch assertion off the test's thread
    while (!done) {
      auto r = c2.call(Lookup{reg2, keys21});
      if (!r || r->status != Status::ok) return;
      const auto& l = std::get<LookupReply>(r->payload);
      if (l.hit.tokens == 640) ++other_hits;
      if (l.lease != 0 && !c2.call(Release{l.lease})) return;
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint32_t first = n.load(1, 50);
  const auto waited = std::chrono::steady_clock::now() - t0;
  done = true;
  other.join();
  REQUIRE(first == 0);  // nothing was read by the timeout
  REQUIRE(waited < std::chrono::milliseconds(1200));  // not the disk's 1.5 s (room for a loaded machine)
  REQUIRE(n.disk("timeouts_total") == 1);
  REQUIRE(n.metric("lookup_misses_total{reason=\"timeout\"}") == 1);
  REQUIRE(other_hits > 0);  // the arena served while the disk was slow
  // The reads went on and committed: the next lookup finds the prompt in the arena.
  eventually([&] { return n.disk("promoted_total") > 0 && n.disk("in_flight") == 0; }, "the slow reads ended");
  const double promoted = n.disk("promoted_total");
  REQUIRE(n.load(1, 50) == static_cast<std::uint32_t>(promoted));
  // The reads dropped at the timeout (never started) left nothing behind:
  // no arena reservation that would make their chunks "stored" for good,
  // no disk pin. Later lookups read them too, and the whole prompt hits.
  REQUIRE(promoted < 50);  // some were dropped, or this shows nothing
  const auto end = std::chrono::steady_clock::now() + 30s;
  std::uint32_t hit = 0;
  while ((hit = n.load(1, 50)) < 50) {
    INFO("prompt 1 hits " << hit << " of 50 chunks; promoted " << n.disk("promoted_total"));
    REQUIRE(std::chrono::steady_clock::now() < end);
    std::this_thread::sleep_for(100ms);
  }
  eventually([&] { return n.disk("in_flight") == 0; }, "the reads ended");
  REQUIRE(n.disk("pinned") == 0);
}

TEST_CASE("disk: a disk hit is answered once its reads end, not at --disk-timeout", "[disk][server]") {
  DiskDir d;
  Node n(d);
  n.store_written(1, 4, 50);
  n.restart(d, {"--disk-timeout", "30000"});  // a fresh arena: prompt 1 is on the disk only
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(n.load(1, 50) == 50);
  const auto waited = std::chrono::steady_clock::now() - t0;
  // A bound against a needless wait, not a timing: 50 reads of 17 KiB take
  // milliseconds; waiting the timeout out takes 30 s.
  REQUIRE(waited < 15s);
  REQUIRE(n.disk("timeouts_total") == 0);
  REQUIRE(n.disk("pinned") == 0);
}

TEST_CASE("disk: a promotion that finds the arena full reads nothing and holds none of its disk run", "[disk][server]") {
  DiskDir d;
  Node n(d);
  n.store(1, 50);
  n.written(50);
  n.restart(d, {"--max-client-reserved", "16M"});  // prompt 1 on the disk only
  // Every slot of the fresh arena reserved by a save still being written:
  // nothing there can be evicted for a promotion.
  Client writer(n.srv.socket_path());
  const std::uint32_t wreg = open_session(writer);
  const ReserveReply held = reserve(writer, wreg, keys(500, 900));  // more than the arena's 816
  std::size_t reserved = 0;
  for (ChunkState c : held.chunks) reserved += c == ChunkState::reserved;
  REQUIRE(reserved > 0);
  REQUIRE(reserved < 900);  // the arena ran out
  REQUIRE(n.load(1, 50) == 0);
  REQUIRE(n.disk("lookups_total") == 1);
  REQUIRE(n.disk("promoted_total") == 0);
  // Before: only the chunk the arena refused was let go; the rest of the
  // run stayed pinned on the disk for good (never evictable).
  REQUIRE(n.disk("pinned") == 0);
  // Once the writer gives its reservation up, the prompt is read.
  REQUIRE(must_call(writer, Commit{held.reservation, false}).status == Status::ok);  // false: aborted
  REQUIRE(n.load(1, 50) == 50);
  REQUIRE(n.disk("pinned") == 0);
}

TEST_CASE("disk: SIGTERM writes the queued write-behind before the server exits, as soon as it is written",
          "[disk][server][fault]") {
  DiskDir d;
  std::optional<Node> n;
  {
    Fault slow("delay-ms=300");  // each write ends 300 ms late: most of 200 are still queued at the signal
    n.emplace(d);
  }
  // 100 objects: within the write queue's bound (an eighth of the arena), so none is dropped.
  for (int p = 1; p <= 2; ++p) n->store(p, 50);
  REQUIRE(n->disk("write_dropped_total") == 0);
  REQUIRE(n->disk("written_total") < 100);
  n->c.reset();
  n->arena.reset();
  // A probe asking /readyz throughout: from the signal on, never ready.
  std::atomic<bool> signalled_yet{false}, reaped{false};
  std::vector<std::string> after;  // what /readyz answered to requests sent after the signal
  std::thread probe([&] {
    while (!reaped) {
      const bool asked_after = signalled_yet;
      const Got g = curl(n->port, "/readyz");
      if (asked_after && g.code != 0) after.push_back(std::to_string(g.code) + " " + g.body);
      std::this_thread::sleep_for(20ms);
    }
  });
  const auto signalled = std::chrono::steady_clock::now();
  signalled_yet = true;
  n->srv.kill(SIGTERM);  // returns once the server is reaped
  const auto stopping = std::chrono::steady_clock::now() - signalled;
  reaped = true;
  probe.join();
  for (const std::string& a : after) {
    INFO(a);
    CHECK(a == "503 not ready: stopping\n");
  }
  CHECK(!after.empty());  // the endpoint answered while the disk drained
  // The drain is woken as each write ends, not at its bound (5 s): a drain
  // that only looked again at its bound kept the server 5 s whatever the
  // disk did. (The writes left at the signal take about a second.)
  INFO("SIGTERM to exit: " << std::chrono::duration<double>(stopping).count() << " s");
  CHECK(stopping < 4s);
  n->restart(d);
  // Before: the stop dropped the queue (only writes already running ended).
  REQUIRE(n->disk("recovered_objects_total") == 100);
  for (int p = 1; p <= 2; ++p) REQUIRE(n->load(p, 50) == 50);
}

TEST_CASE("disk: a namespace drop takes its writes still queued: none is written after it, none found after a restart",
          "[disk][server][fault]") {
  DiskDir d;
  std::optional<Node> n;
  {
    Fault slow("delay-ms=300");  // each write ends 300 ms late: most of 100 are still queued at the drop
    n.emplace(d);
  }
  for (int p = 1; p <= 2; ++p) n->store(p, 50);
  REQUIRE(n->disk("write_dropped_total") == 0);
  REQUIRE(n->disk("written_total") < 100);
  REQUIRE(must_call(*n->c, Drop{kv::namespace_of(layout())}).status == Status::ok);
  eventually([&] { return n->disk("write_queue") == 0 && n->disk("in_flight") == 0; }, "the disk is idle");
  REQUIRE(n->disk("objects") == 0);
  n->restart(d);
  REQUIRE(n->disk("recovered_objects_total") == 0);
  for (int p = 1; p <= 2; ++p) REQUIRE(n->load(p, 50) == 0);
}

TEST_CASE("disk: a tenant's drop reaches the namespaces only the disk still holds of it", "[disk][server][tenants]") {
  DiskDir d;
  Node n(d);
  kv::Layout tl = layout();
  tl.tenant = "team-a";
  tl.weight_version = "v1";
  Reply rr = must_call(*n.c, RegisterLayout{tl});
  REQUIRE(rr.status == Status::ok);
  const std::uint32_t treg = std::get<RegisterReply>(rr.payload).registration;
  const auto tkeys = [&](int seed) {
    std::vector<std::uint32_t> toks(50 * 64);
    for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint32_t>(seed * 131 + i);
    return kv::chunk_keys(tl, kv::namespace_of(tl), toks);
  };
  for (int p = 1; p <= 6; ++p) {  // 300 objects of team-a's, each written to the disk
    const ReserveReply r = reserve(*n.c, treg, tkeys(p));
    REQUIRE(must_call(*n.c, Commit{r.reservation, true}).status == Status::ok);
    n.written(50.0 * p);
  }
  n.store_written(10, 29, 50);  // 1000 objects of no tenant's push team-a's out of the arena
  REQUIRE(n.metric("tenant_bytes{tenant=\"team-a\",level=\"arena\"}") == 0);
  REQUIRE(n.metric("tenant_bytes{tenant=\"team-a\",level=\"disk\"}") == 300.0 * static_cast<double>(kObject));
  Reply r = must_call(*n.c, DropTenant{"team-a"});
  REQUIRE(r.status == Status::ok);
  REQUIRE(std::get<DropReply>(r.payload).lower_objects == 300);
  REQUIRE(lookup(*n.c, treg, tkeys(1)).hit.tokens == 0);  // not promoted from the disk
  REQUIRE(n.metric("tenant_bytes{tenant=\"team-a\",level=\"disk\"}") == 0);
  REQUIRE(n.load(29, 50) == 50);  // the rest stays
}
