// The node tier's index (tier::Index, what kvstrand-server runs on its
// strand for every request) at 10k, 100k and 1M stored objects (--max
// 10000000 adds 10M: about 1.5 GiB of memory): a lookup of
// 512 keys that all hit (one of 8 hot prompts), leased and released (one lookup request and the
// release its load sends), and a reserve + commit of 16 new chunks into a
// full index (each evicts an unleased object). p50 and p99 in microseconds;
// the last lines are the cost at the largest size over the cost at 10k, p50
// and p99 (issue 66's goal: p99 within 2x at 10M).
//
// usage: bench_index [--rounds N] [--max N]
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "percentile.hpp"
#include "tier/index.hpp"
#include "numbered_key.hpp"

using namespace kvstrand;
using kvstrand::bench::pct;
using Clock = std::chrono::steady_clock;

namespace {

kv::ChunkKey key(std::uint64_t i) { return bench::numbered_key(i); }

struct Figures {
  double lookup_p50, lookup_p99, store_p50, store_p99;
};

Figures measure(std::uint32_t objects, int rounds) {
  tier::Index index(1);
  index.add_slots(objects);
  std::vector<bool> no(16, false);
  for (std::uint64_t i = 0; i < objects; i += 16) {
    std::vector<kv::ChunkKey> ks;
    for (std::uint64_t j = i; j < i + 16 && j < objects; ++j) ks.push_back(key(j));
    std::unique_ptr<bool[]> images(new bool[ks.size()]());
    index.commit(index.reserve(ks, std::span<const bool>(images.get(), ks.size()), 1).id, true);
  }
  for (std::uint64_t p = 0; p < 8; ++p) {  // the hot prompts have been used
    std::vector<kv::ChunkKey> ks;
    for (std::uint64_t j = p * 512; j < (p + 1) * 512; ++j) ks.push_back(key(j));
    (void)index.lookup(ks, 256);
  }
  std::mt19937_64 rng(7);
  std::uint64_t next = objects;
  std::vector<double> lookup_us, store_us;
  bool none[16] = {};
  for (int r = 0; r < rounds; ++r) {
    // One of 8 hot prompts of 512 chunks (stored first): looked up often,
    // they stay stored while the stores below evict the cold rest.
    const std::uint64_t first = static_cast<std::uint64_t>(rng() % 8) * 512;
    std::vector<kv::ChunkKey> ks;
    for (std::uint64_t j = first; j < first + 512; ++j) ks.push_back(key(j));
    auto t0 = Clock::now();
    const auto lease = index.lease(ks, 256, 2);
    index.release(lease.id);
    lookup_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (lease.hit.tokens != 512 * 256) {
      std::fprintf(stderr, "bench_index: a lookup missed (%u tokens)\n", lease.hit.tokens);
      std::exit(1);
    }
    std::vector<kv::ChunkKey> fresh;
    for (int j = 0; j < 16; ++j) fresh.push_back(key(next++));
    t0 = Clock::now();
    const auto res = index.reserve(fresh, std::span<const bool>(none, 16), 3);
    index.commit(res.id, true);
    store_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (res.reserved != 16) {
      std::fprintf(stderr, "bench_index: a reserve was refused\n");
      std::exit(1);
    }
  }
  return {pct(lookup_us, 0.5), pct(lookup_us, 0.99), pct(store_us, 0.5), pct(store_us, 0.99)};
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 2000;
  std::uint32_t max = 1'000'000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rounds") rounds = std::max(100, std::stoi(argv[i + 1]));
    else if (a == "--max") max = static_cast<std::uint32_t>(std::max(10'000ul, std::stoul(argv[i + 1])));
    else {
      std::fprintf(stderr, "usage: bench_index [--rounds N] [--max N]\n");
      return 2;
    }
  }
  std::printf("bench_index: tier::Index, %d rounds of (lookup+lease+release of 512 keys; reserve+commit of 16)\n",
              rounds);
  std::vector<Figures> all;
  for (std::uint32_t n = 10'000; n <= max; n *= 10) {
    all.push_back(measure(n, rounds));
    const Figures& f = all.back();
    std::printf("  %8u objects: lookup 512 us p50 %7.1f p99 %7.1f | reserve+commit 16 us p50 %6.1f p99 %6.1f\n", n,
                f.lookup_p50, f.lookup_p99, f.store_p50, f.store_p99);
    std::fflush(stdout);
  }
  const Figures& hi = all.back();
  const Figures& lo = all.front();
  const std::uint32_t largest = 10'000 * static_cast<std::uint32_t>(std::pow(10, all.size() - 1));
  std::printf("index cost at %u / at 10000 objects (p50): lookup %.2f, reserve+commit %.2f\n", largest,
              hi.lookup_p50 / lo.lookup_p50, hi.store_p50 / lo.store_p50);
  std::printf("index cost at %u / at 10000 objects (p99): lookup %.2f, reserve+commit %.2f (goal: <= 2)\n", largest,
              hi.lookup_p99 / lo.lookup_p99, hi.store_p99 / lo.store_p99);
  return 0;
}
