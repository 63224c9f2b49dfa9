// The node tier's index (tier::Index, what kvstrand-server runs on its
// strand for every request) at 10k, 100k and 1M stored objects (--max
// 10000000 adds 10M: about 1.5 GiB of memory): a lookup of 512 keys that
// all hit, leased and released (one lookup request and the release its load
// sends), of a prompt whose chunks were saved together and of one whose
// chunks were saved apart; and a reserve + commit of 16 new chunks into a
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
  double lookup_p50, lookup_p99, apart_p50, apart_p99, store_p50, store_p99;
};

// The hot prompts: 8 of 512 chunks whose chunks were saved together (keys
// 0-4095, each save of 16 in consecutive slots, as a request's chunks are
// stored), then 8 whose chunks were saved one at a time among everything
// else (keys 4096-8191, each in a slot apart from its neighbours': a
// layout the index cannot walk in order).
constexpr std::uint64_t kPrompt = 512, kPrompts = 8;

std::vector<kv::ChunkKey> prompt(std::uint64_t number) {
  std::vector<kv::ChunkKey> ks;
  for (std::uint64_t j = number * kPrompt; j < (number + 1) * kPrompt; ++j) ks.push_back(key(j));
  return ks;
}

Figures measure(std::uint32_t objects, int rounds) {
  tier::Index index(1);
  index.add_slots(objects);
  // The order the keys are saved in: in order, but each of the apart
  // prompts' keys swapped with one of the cold rest, so it lands in a random
  // slot (the index hands out slots in the order saves come).
  std::vector<std::uint64_t> order(objects);
  for (std::uint64_t i = 0; i < objects; ++i) order[i] = i;
  std::mt19937_64 place(11);
  const std::uint64_t cold = 2 * kPrompts * kPrompt;
  for (std::uint64_t j = kPrompts * kPrompt; j < cold; ++j)
    std::swap(order[j], order[cold + place() % (objects - cold)]);
  for (std::uint64_t i = 0; i < objects; i += 16) {
    std::vector<kv::ChunkKey> ks;
    for (std::uint64_t j = i; j < i + 16 && j < objects; ++j) ks.push_back(key(order[j]));
    std::unique_ptr<bool[]> images(new bool[ks.size()]());
    index.commit(index.reserve(ks, std::span<const bool>(images.get(), ks.size()), 1).id, true);
  }
  for (std::uint64_t p = 0; p < 2 * kPrompts; ++p) (void)index.lookup(prompt(p), 256);  // the hot prompts have been used
  std::mt19937_64 rng(7);
  std::uint64_t next = objects;
  std::vector<double> lookup_us, apart_us, store_us;
  bool none[16] = {};
  // One lookup of 512 chunks, leased and released, timed into `us`.
  const auto lookup = [&](std::uint64_t number, std::vector<double>& us) {
    const std::vector<kv::ChunkKey> ks = prompt(number);
    const auto t0 = Clock::now();
    const auto lease = index.lease(ks, 256, 2);
    index.release(lease.id);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (lease.hit.tokens != kPrompt * 256) {
      std::fprintf(stderr, "bench_index: a lookup missed (%u tokens)\n", lease.hit.tokens);
      std::exit(1);
    }
  };
  for (int r = 0; r < rounds; ++r) {
    // One hot prompt of each layout: looked up often, they stay stored
    // while the stores below evict the cold rest.
    lookup(rng() % kPrompts, lookup_us);
    lookup(kPrompts + rng() % kPrompts, apart_us);
    std::vector<kv::ChunkKey> fresh;
    for (int j = 0; j < 16; ++j) fresh.push_back(key(next++));
    const auto t0 = Clock::now();
    const auto res = index.reserve(fresh, std::span<const bool>(none, 16), 3);
    index.commit(res.id, true);
    store_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (res.reserved != 16) {
      std::fprintf(stderr, "bench_index: a reserve was refused\n");
      std::exit(1);
    }
  }
  return {pct(lookup_us, 0.5),    pct(lookup_us, 0.99), pct(apart_us, 0.5),
          pct(apart_us, 0.99), pct(store_us, 0.5),  pct(store_us, 0.99)};
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
  std::printf("bench_index: tier::Index, %d rounds of (lookup+lease+release of 512 keys saved together, of 512 "
              "saved apart; reserve+commit of 16)\n",
              rounds);
  std::vector<Figures> all;
  for (std::uint32_t n = 10'000; n <= max; n *= 10) {
    all.push_back(measure(n, rounds));
    const Figures& f = all.back();
    std::printf("  %8u objects: lookup 512 us p50 %6.1f p99 %6.1f | apart p50 %6.1f p99 %6.1f | reserve+commit 16 "
                "us p50 %5.1f p99 %5.1f\n",
                n, f.lookup_p50, f.lookup_p99, f.apart_p50, f.apart_p99, f.store_p50, f.store_p99);
    std::fflush(stdout);
  }
  const Figures& hi = all.back();
  const Figures& lo = all.front();
  const std::uint32_t largest = 10'000 * static_cast<std::uint32_t>(std::pow(10, all.size() - 1));
  std::printf("index cost at %u / at 10000 objects (p50): lookup %.2f, saved apart %.2f, reserve+commit %.2f\n",
              largest, hi.lookup_p50 / lo.lookup_p50, hi.apart_p50 / lo.apart_p50, hi.store_p50 / lo.store_p50);
  std::printf("index cost at %u / at 10000 objects (p99): lookup %.2f, saved apart %.2f, reserve+commit %.2f (goal: "
              "<= 2)\n",
              largest, hi.lookup_p99 / lo.lookup_p99, hi.apart_p99 / lo.apart_p99, hi.store_p99 / lo.store_p99);
  return 0;
}
