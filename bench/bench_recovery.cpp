// The node tier at scale (issue 66): a named arena's restart, in process, as
// kvstrand-server does it at start (server::recover: every slab's object
// table read into the size classes), at 10k, 100k and 1M objects of 512 B
// (--max 10000000 adds 10M: about 6 GiB of memory). Per size:
// - fill: the objects stored 16 to a save (reserve + commit, the table
//   journalled into the arena), objects/s;
// - index: the heap the size classes and their index hold, bytes per object
//   stored and per slot (a class's index is sized by the slabs it holds;
//   the arena itself, and its tables, are not heap);
// - restart: the tables read back into new size classes (recover), seconds
//   and objects/s, and then every object looked up and checked byte for
//   byte (its 512 B written from its number at the fill).
// The last lines: the restart's rate at the largest size over the smallest
// (flat: 1), and the largest restart's time against the goals (1M within 1 s,
// 10M within 10 s).
//
// usage: bench_recovery [--max N]
#include <malloc.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "server/arena_recovery.hpp"
#include "tier/object_table.hpp"
#include "tier/size_classes.hpp"
#include "numbered_key.hpp"

using namespace kvstrand;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint64_t kObject = 512;
constexpr std::uint64_t kSlab = 64ull << 20;

kv::ChunkKey key(std::uint64_t i) { return bench::numbered_key(i); }

void fill_object(std::byte* p, std::uint64_t i) {
  for (std::uint64_t w = 0; w < kObject / 8; ++w) {
    const std::uint64_t v = i * 0x9e3779b97f4a7c15ull + w;
    std::memcpy(p + w * 8, &v, 8);
  }
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
std::size_t heap() {  // in use: small blocks, and the large ones malloc maps itself
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

struct Figures {
  std::uint64_t objects = 0;
  double fill_per_s = 0, heap_per_object = 0, heap_per_slot = 0, restart_s = 0, restart_per_s = 0;
  std::uint64_t checked = 0;
};

Figures run(std::uint64_t n) {
  Figures f;
  const std::uint64_t per_slab = tier::described_geometry(kSlab, kObject).per_slab;
  const std::uint32_t slabs = static_cast<std::uint32_t>((n + per_slab - 1) / per_slab);
  const std::uint64_t bytes = std::uint64_t{slabs} * kSlab;
  void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    std::fprintf(stderr, "bench_recovery: cannot map %llu B\n", static_cast<unsigned long long>(bytes));
    std::exit(1);
  }
  auto* arena = static_cast<std::byte*>(m);
  f.objects = n;
  {
    // The first life: stored, then gone without a word (a SIGKILL leaves
    // the arena as it is).
    const std::size_t before = heap();
    tier::ObjectTable table(arena, bytes, kSlab);
    auto classes = std::make_unique<tier::SizeClasses>(kSlab, &table);
    classes->set_slab_count(slabs);  // as the server's classes know the arena's
    for (std::uint32_t s = 0; s < slabs; ++s) classes->add_slab(s);
    tier::Index& idx = *classes->index(kObject);
    bool none[16] = {};
    const auto t0 = Clock::now();
    for (std::uint64_t i = 0; i < n; i += 16) {
      std::vector<kv::ChunkKey> ks;
      for (std::uint64_t j = i; j < i + 16 && j < n; ++j) ks.push_back(key(j));
      classes->make_room(idx, ks.size());  // a class takes its slabs as it grows, as the server's do
      const auto r = idx.reserve(ks, std::span<const bool>(none, ks.size()), 1);
      if (r.reserved != ks.size()) {
        std::fprintf(stderr, "bench_recovery: the arena refused a save at %llu objects\n",
                     static_cast<unsigned long long>(i));
        std::exit(1);
      }
      for (std::size_t j = 0; j < ks.size(); ++j) fill_object(arena + classes->offset_of(idx, r.slots[j]), i + j);
      idx.commit(r.id, true);
    }
    f.fill_per_s = static_cast<double>(n) / seconds_since(t0);
    f.heap_per_object = static_cast<double>(heap() - before) / static_cast<double>(n);
    f.heap_per_slot = static_cast<double>(heap() - before) / static_cast<double>(std::uint64_t{slabs} * per_slab);
    classes.release();  // leaked on purpose: a killed server frees nothing
  }
  tier::ObjectTable table(arena, bytes, kSlab);
  tier::SizeClasses classes(kSlab, &table);
  classes.set_slab_count(slabs);
  const auto t0 = Clock::now();
  const server::Recovery r = server::recover(table, classes);
  f.restart_s = seconds_since(t0);
  f.restart_per_s = static_cast<double>(r.objects) / f.restart_s;
  if (r.objects != n || !r.started_empty.empty()) {
    std::fprintf(stderr, "bench_recovery: %llu of %llu objects recovered (%s)\n",
                 static_cast<unsigned long long>(r.objects), static_cast<unsigned long long>(n), r.started_empty.c_str());
    std::exit(1);
  }
  // Every object, looked up and compared with what the fill wrote.
  tier::Index& idx = *classes.index(kObject);
  std::vector<std::byte> want(kObject);
  for (std::uint64_t i = 0; i < n; ++i) {
    const kv::ChunkKey k[] = {key(i)};
    const auto lease = idx.lease(k, 256, 2);
    if (lease.slots.size() != 1) {
      std::fprintf(stderr, "bench_recovery: object %llu not found after the restart\n", static_cast<unsigned long long>(i));
      std::exit(1);
    }
    fill_object(want.data(), i);
    if (std::memcmp(arena + classes.offset_of(idx, lease.slots[0]), want.data(), kObject) != 0) {
      std::fprintf(stderr, "bench_recovery: object %llu differs after the restart\n", static_cast<unsigned long long>(i));
      std::exit(1);
    }
    idx.release(lease.id);
    ++f.checked;
  }
  ::munmap(m, bytes);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t max = 1'000'000;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--max") max = std::stoull(argv[i + 1]);
  std::printf("bench_recovery: a named arena's restart (server::recover), objects of %llu B in slabs of %llu MiB\n",
              static_cast<unsigned long long>(kObject), static_cast<unsigned long long>(kSlab >> 20));
  std::vector<Figures> all;
  for (std::uint64_t n = 10'000; n <= max; n *= 10) {
    all.push_back(run(n));
    const Figures& f = all.back();
    std::printf("  %9llu objects: fill %9.0f objects/s | index heap %6.1f B/object, %5.1f B/slot | restart %7.3f s, "
                "%10.0f objects/s | checked %llu byte for byte\n",
                static_cast<unsigned long long>(f.objects), f.fill_per_s, f.heap_per_object, f.heap_per_slot, f.restart_s,
                f.restart_per_s, static_cast<unsigned long long>(f.checked));
    std::fflush(stdout);
  }
  const Figures& big = all.back();
  std::printf("restart rate at %llu / at %llu objects: %.2f (flat: 1)\n",
              static_cast<unsigned long long>(big.objects), static_cast<unsigned long long>(all.front().objects),
              big.restart_per_s / all.front().restart_per_s);
  std::printf("restart of %llu objects: %.3f s (goal: 1M within 1 s, 10M within 10 s)\n",
              static_cast<unsigned long long>(big.objects), big.restart_s);
  return 0;
}
