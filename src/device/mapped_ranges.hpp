#pragma once
// MappedRanges: the host ranges this process pinned or registered through
// the backend and the device maps at the same address. A batch whose host
// side lies inside them needs no pointer query before the gather kernel
// reads it: the query was asked once, when the range was added.
//
// Any thread: registrations come from whichever thread maps an arena, the
// checks from the reactor's; a mutex, as the driver's own tables behind the
// query it replaces take one. A range is removed before its memory is
// unpinned, so a check never vouches for memory the device no longer maps.
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <vector>

#include "device/copy.hpp"

namespace kvstrand::device {

class MappedRanges {
 public:
  // [base, base + bytes): ranges never overlap (the device refuses to pin
  // the same page twice), so one added over another replaces it.
  void add(const void* base, std::size_t bytes);
  // The range that starts at base, if any.
  void remove(const void* base);
  // Whether the first and the last segment's host side (src host to
  // device, dst device to host) each lie inside one range. Device to device
  // has no host side: false.
  bool host_sides_inside(std::span<const Segment> segs, CopyKind kind) const;
  std::size_t size() const;

 private:
  struct Range {
    std::uintptr_t begin;
    std::uintptr_t end;
  };
  const Range* holding_locked(std::uintptr_t p, std::size_t bytes) const;

  mutable std::mutex mu_;
  std::vector<Range> ranges_;  // sorted by begin
};

}  // namespace kvstrand::device
