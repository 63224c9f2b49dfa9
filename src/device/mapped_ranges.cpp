#include "device/mapped_ranges.hpp"

#include <algorithm>

namespace kvstrand::device {

void MappedRanges::add(const void* base, std::size_t bytes) {
  const auto b = reinterpret_cast<std::uintptr_t>(base);
  if (bytes == 0 || b + bytes < b) return;  // nothing, or a range that wraps: never vouched for
  std::lock_guard lock(mu_);
  const Range r{b, b + bytes};
  // Drop whatever the new range overlaps: what was pinned there is gone.
  std::erase_if(ranges_, [&](const Range& x) { return x.begin < r.end && r.begin < x.end; });
  ranges_.insert(std::upper_bound(ranges_.begin(), ranges_.end(), r.begin,
                                  [](std::uintptr_t v, const Range& x) { return v < x.begin; }),
                 r);
}

void MappedRanges::remove(const void* base) {
  const auto b = reinterpret_cast<std::uintptr_t>(base);
  std::lock_guard lock(mu_);
  std::erase_if(ranges_, [&](const Range& x) { return x.begin == b; });
}

const MappedRanges::Range* MappedRanges::holding_locked(std::uintptr_t p, std::size_t bytes) const {
  // The last range starting at or before p is the only one that can hold it.
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), p,
                             [](std::uintptr_t v, const Range& x) { return v < x.begin; });
  if (it == ranges_.begin()) return nullptr;
  --it;
  return p + bytes >= p && p + bytes <= it->end ? &*it : nullptr;
}

bool MappedRanges::host_sides_inside(std::span<const Segment> segs, CopyKind kind) const {
  if (kind == CopyKind::device_to_device || segs.empty()) return false;
  // The first and the last segment, as the two pointer queries this
  // replaces: a batch's host side is one arena in practice, and a pass
  // over every segment would cost a paged load of ten thousand segments
  // more than those two queries did.
  const auto host = [kind](const Segment& g) {
    return reinterpret_cast<std::uintptr_t>(kind == CopyKind::host_to_device ? g.src : g.dst);
  };
  std::lock_guard lock(mu_);
  return holding_locked(host(segs.front()), segs.front().bytes) != nullptr &&
         holding_locked(host(segs.back()), segs.back().bytes) != nullptr;
}

std::size_t MappedRanges::size() const {
  std::lock_guard lock(mu_);
  return ranges_.size();
}

}  // namespace kvstrand::device
