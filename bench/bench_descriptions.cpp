// The server's memory per object with KV events on (issue 66): the size
// classes' index, and TierEvents' per slot and per description, filled as
// kvstrand-server fills them (a reserve, its chunk's description, a
// commit; the slot then keeps BlockRemoved's part of the description
// alone, TierEvents::keep_removal_only), at N objects of 512 B (--objects,
// default 1M). Each object is
// its own chunk, described as kvstrand.vllm describes one (block_hashes:
// 64-bit ints, vLLM's default; parent_block_hash; token_ids from a 128k
// vocabulary; block_size 16; lora_id, lora_name, group_idx), for chunks of
// 16, 64 and 256 tokens. Rows:
// - the index alone (no --events);
// - --events, objects without a description (an older client);
// - each chunk size, the arena alone, and with every object's copy on the
//   disk too (the disk's index beside the arena's: 2 objects a chunk);
// - the baseline, in the same run: 256-token chunks with every description
//   kept whole (as the server kept them before keep_removal_only).
// Per row: the heap the indexes and TierEvents hold (malloc's own count,
// the publisher's replay buffer held to 1 MiB), bytes per object and per
// chunk, and the descriptions' own bytes per chunk (the floor: what the
// events carry of it).
//
// usage: bench_descriptions [--objects N]
#include <malloc.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "numbered_key.hpp"
#include "server/events/msgpack.hpp"
#include "server/events/tier_events.hpp"
#include "tier/size_classes.hpp"

using namespace kvstrand;

namespace {

constexpr std::uint64_t kObject = 512;
constexpr std::uint64_t kSlab = 64ull << 20;
constexpr std::uint32_t kBlock = 16;

std::size_t heap() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

// Chunk `i`'s description as kvstrand.vllm writes one (python/kvstrand/vllm/events.py).
std::string describe(std::uint64_t i, std::uint32_t tokens, std::mt19937_64& rng) {
  server::msgpack::Writer w;
  w.map(8);
  w.str("block_hashes");
  w.array(tokens / kBlock);
  for (std::uint32_t b = 0; b < tokens / kBlock; ++b) w.uint(rng());
  w.str("parent_block_hash");
  if (i % 4 == 0) w.nil(); else w.uint(rng());
  w.str("token_ids");
  w.array(tokens);
  for (std::uint32_t t = 0; t < tokens; ++t) w.uint(rng() % 128256);
  w.str("block_size");
  w.uint(kBlock);
  w.str("extra_keys");
  w.nil();
  w.str("lora_id");
  w.nil();
  w.str("lora_name");
  w.nil();
  w.str("group_idx");
  w.uint(0);
  return w.take();
}

struct Row {
  const char* what;
  std::uint32_t tokens = 0;  // 0: no description
  bool events = true, disk = false;
  bool whole = false;  // descriptions kept whole (the baseline)
};

struct Figures {
  double per_object = 0, per_chunk = 0, description = 0;
};

Figures run(const Row& row, std::uint64_t n) {
  boost::asio::io_context io;
  std::shared_ptr<server::EventPublisher> publisher;
  const std::string endpoint = "ipc:///tmp/kvstrand-bench-descriptions-" + std::to_string(::getpid());
  const std::size_t before = heap();
  std::unique_ptr<server::TierEvents> events;
  if (row.events) {
    server::EventOptions o;
    o.endpoint = endpoint;
    o.buffer = 1;
    o.buffer_bytes = 1 << 20;
    auto p = server::EventPublisher::open(boost::asio::make_strand(io), o);
    if (!p) {
      std::fprintf(stderr, "bench_descriptions: %s\n", p.why().c_str());
      std::exit(1);
    }
    publisher = *p;
    events = std::make_unique<server::TierEvents>(publisher);
  }
  const std::uint64_t per_slab = kSlab / kObject;
  const auto slabs = static_cast<std::uint32_t>((n + per_slab - 1) / per_slab);
  tier::SizeClasses arena(kSlab), disk(kSlab);
  if (events) {
    events->watch(arena, "CPU");
    events->watch(disk, "DISK");
  }
  for (std::uint32_t s = 0; s < slabs; ++s) {
    arena.add_slab(s);
    if (row.disk) disk.add_slab(s);
  }
  tier::Index& a = *arena.index(kObject);
  tier::Index* d = row.disk ? disk.index(kObject) : nullptr;
  std::mt19937_64 rng(1);
  std::uint64_t description_bytes = 0;
  for (std::uint64_t i = 0; i < n; ++i) {
    const kv::ChunkKey k = bench::numbered_key(i);
    arena.make_room(a, 1);
    std::uint32_t slot = 0;
    if (a.reserve(k, false, &slot) != tier::Index::Reserve::reserved) {
      std::fprintf(stderr, "bench_descriptions: the arena refused object %llu\n", static_cast<unsigned long long>(i));
      std::exit(1);
    }
    if (events && row.tokens != 0) {
      const std::string desc = describe(i, row.tokens, rng);
      description_bytes += desc.size();
      events->describe(a, slot, desc);
    }
    a.commit(k);
    // The disk's write-behind item holds the whole description past the
    // arena slot's trim.
    const server::DescriptionPool::Id item =
        events && d != nullptr ? events->hold_whole(a, slot) : server::DescriptionPool::kNone;
    if (events && !row.whole) events->keep_removal_only(a, {&slot, 1});
    if (d != nullptr) {  // the disk's write-behind: its copy, described as the arena's object was
      disk.make_room(*d, 1);
      std::uint32_t dslot = 0;
      if (d->reserve(k, false, &dslot) != tier::Index::Reserve::reserved) std::exit(1);
      if (events) {
        events->describe(*d, dslot, item);
        events->release(item);
      }
      d->commit(k);
      if (events && !row.whole) events->keep_removal_only(*d, {&dslot, 1});
    }
  }
  const double held = static_cast<double>(heap() - before);
  Figures f;
  f.per_chunk = held / static_cast<double>(n);
  f.per_object = held / static_cast<double>(row.disk ? 2 * n : n);
  f.description = static_cast<double>(description_bytes) / static_cast<double>(n);
  events.reset();
  publisher.reset();
  ::unlink(endpoint.substr(6).c_str());
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t n = 1'000'000;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--objects") n = std::stoull(argv[i + 1]);
  std::printf("bench_descriptions: the server's heap per object with KV events, %llu chunks of %llu B objects\n",
              static_cast<unsigned long long>(n), static_cast<unsigned long long>(kObject));
  const Row rows[] = {
      {"index alone (no --events)", 0, false, false},
      {"--events, no descriptions", 0, true, false},
      {"16-token chunks, arena", 16, true, false},
      {"16-token chunks, arena + disk", 16, true, true},
      {"64-token chunks, arena", 64, true, false},
      {"64-token chunks, arena + disk", 64, true, true},
      {"256-token chunks, arena", 256, true, false},
      {"256-token chunks, arena + disk", 256, true, true},
      {"256-token, arena, kept whole", 256, true, false, true},
      {"256-token, arena + disk, kept whole", 256, true, true, true},
  };
  for (const Row& r : rows) {
    const Figures f = run(r, n);
    std::printf("  %-36s %7.1f B/object %7.1f B/chunk | description %6.1f B/chunk\n", r.what, f.per_object,
                f.per_chunk, f.description);
    std::fflush(stdout);
  }
  return 0;
}
