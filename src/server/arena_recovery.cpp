#include "server/arena_recovery.hpp"

#include <chrono>
#include <map>

namespace kvstrand::server {

Recovery recover(tier::ObjectTable& table, tier::SizeClasses& classes) {
  const auto t0 = std::chrono::steady_clock::now();
  Recovery r;
  r.named = r.reopened = true;
  tier::ObjectTable::Recovery found = table.scan();
  r.dropped_uncommitted = found.dropped_uncommitted;
  r.dropped_corrupt = found.dropped_corrupt;
  if (!found.unreadable.empty()) {
    r.started_empty = found.unreadable;
  } else {
    // Each class's index sized for all its slabs at once: adopted slab by
    // slab, it would grow and copy every entry before it once a slab, a
    // restart quadratic in the arena's objects (docs/PERFORMANCE.md,
    // bench_recovery).
    std::map<std::uint64_t, std::uint64_t> slots_of;
    for (const auto& slab : found.slabs) slots_of[slab.object_bytes] += slab.slots.size();
    for (const auto& [object_bytes, slots] : slots_of)
      if (tier::Index* idx = classes.index(object_bytes)) idx->reserve_slots(slots);
    for (const auto& slab : found.slabs) {
      std::size_t found_here = 0;
      for (const auto& o : slab.slots) found_here += o.has_value();
      std::size_t duplicates = 0;
      if (classes.adopt_slab(slab.slab, slab.object_bytes, slab.slots, &duplicates) == nullptr) {
        r.dropped_corrupt += found_here;  // no class can take it here (more sizes than a server serves)
        continue;
      }
      r.objects += found_here - duplicates;
      r.dropped_corrupt += duplicates;
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kvstrand::server
