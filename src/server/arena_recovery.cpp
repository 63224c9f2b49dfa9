#include "server/arena_recovery.hpp"

#include <chrono>

namespace kvstrand::server {

Recovery recover(tier::ObjectTable& table, tier::SizeClasses& classes) {
  const auto t0 = std::chrono::steady_clock::now();
  Recovery r;
  r.named = r.reopened = true;
  // The headers first: an arena that cannot be read is found before any
  // of it is adopted, and each class's index is sized for all its slabs
  // at once: adopted slab by slab, it would grow once a slab
  // (docs/PERFORMANCE.md, bench_recovery).
  const tier::ObjectTable::Census census = table.census();
  if (!census.unreadable.empty()) {
    r.started_empty = census.unreadable;
  } else {
    for (const auto& [object_bytes, slots] : census.slots_by_object_size)
      if (tier::Index* idx = classes.index(object_bytes)) idx->reserve_slots(slots);
    // Then the entries, a slab at a time, each adopted as it is read.
    const tier::ObjectTable::Recovery found = table.scan([&](const tier::ObjectTable::Slab& slab) {
      std::size_t found_here = 0;
      for (const auto& o : slab.slots) found_here += o.has_value();
      std::size_t duplicates = 0;
      if (classes.adopt_slab(slab.slab, slab.object_bytes, slab.slots, &duplicates) == nullptr) {
        r.dropped_corrupt += found_here;  // no class can take it here (more sizes than a server serves)
        return;
      }
      r.objects += found_here - duplicates;
      r.dropped_corrupt += duplicates;
    });
    r.dropped_uncommitted = found.dropped_uncommitted;
    r.dropped_corrupt += found.dropped_corrupt;
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kvstrand::server
