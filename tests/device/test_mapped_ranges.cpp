// MappedRanges vouches for a batch's host side only where every segment
// lies wholly inside one added range, and never for a range once removed
// or replaced. Pure: fake addresses, nothing dereferenced.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "device/mapped_ranges.hpp"

using kvstrand::device::CopyKind;
using kvstrand::device::MappedRanges;
using kvstrand::device::Segment;

namespace {

void* at(std::uintptr_t a) { return reinterpret_cast<void*>(a); }

// A load's segments: the host side at host + offset, the device side anywhere.
std::vector<Segment> load(std::uintptr_t host, std::initializer_list<std::pair<std::uintptr_t, std::size_t>> runs) {
  std::vector<Segment> s;
  for (auto [off, bytes] : runs) s.push_back({at(host + off), at(0x7000'0000'0000 + off), bytes});
  return s;
}

}  // namespace

TEST_CASE("MappedRanges: a batch inside one range is vouched for, one byte past its end is not", "[device]") {
  MappedRanges r;
  const std::uintptr_t base = 0x1000'0000;
  r.add(at(base), 1 << 20);
  CHECK(r.host_sides_inside(load(base, {{0, 4096}, {8192, 4096}, {(1 << 20) - 4096, 4096}}), CopyKind::host_to_device));
  CHECK_FALSE(r.host_sides_inside(load(base, {{0, 4096}, {(1 << 20) - 4096, 4097}}), CopyKind::host_to_device));
  // A segment before the range; a batch whose first or last segment lies
  // outside it.
  CHECK_FALSE(r.host_sides_inside(load(base - 4096, {{0, 4096}}), CopyKind::host_to_device));
  CHECK_FALSE(r.host_sides_inside(load(base, {{2 << 20, 4096}, {4096, 4096}}), CopyKind::host_to_device));
  CHECK_FALSE(r.host_sides_inside(load(base, {{0, 4096}, {4096, 4096}, {2 << 20, 4096}}), CopyKind::host_to_device));
}

TEST_CASE("MappedRanges: the host side is the source of a load and the destination of a save", "[device]") {
  MappedRanges r;
  r.add(at(0x1000'0000), 1 << 20);
  std::vector<Segment> save{{at(0x7000'0000'0000), at(0x1000'0000), 4096}, {at(0x7000'0001'0000), at(0x1000'2000), 4096}};
  CHECK(r.host_sides_inside(save, CopyKind::device_to_host));
  CHECK_FALSE(r.host_sides_inside(save, CopyKind::host_to_device));
  CHECK_FALSE(r.host_sides_inside(save, CopyKind::device_to_device));
  CHECK_FALSE(r.host_sides_inside({}, CopyKind::host_to_device));
}

TEST_CASE("MappedRanges: segments across two ranges, each inside one, are vouched for, one spanning both is not",
          "[device]") {
  MappedRanges r;
  r.add(at(0x3000'0000), 1 << 20);
  r.add(at(0x1000'0000), 1 << 20);  // added out of order: kept sorted
  CHECK(r.size() == 2);
  std::vector<Segment> both{{at(0x1000'0000), at(0x7000'0000'0000), 4096},
                            {at(0x3000'0000), at(0x7000'0000'1000), 4096},
                            {at(0x1000'1000), at(0x7000'0000'2000), 4096}};
  CHECK(r.host_sides_inside(both, CopyKind::host_to_device));
  // Adjacent ranges are still two registrations: a segment across the seam
  // is not inside either.
  r.add(at(0x1010'0000), 1 << 20);
  CHECK_FALSE(r.host_sides_inside(load(0x1010'0000 - 4096, {{0, 8192}}), CopyKind::host_to_device));
}

TEST_CASE("MappedRanges: a removed range is no longer vouched for, an overlapping add replaces the old", "[device]") {
  MappedRanges r;
  r.add(at(0x1000'0000), 1 << 20);
  r.remove(at(0x1000'0000));
  CHECK(r.size() == 0);
  CHECK_FALSE(r.host_sides_inside(load(0x1000'0000, {{0, 4096}}), CopyKind::host_to_device));

  r.add(at(0x1000'0000), 1 << 20);
  r.add(at(0x1008'0000), 4096);  // over the first's second half: the first is gone
  CHECK(r.size() == 1);
  CHECK_FALSE(r.host_sides_inside(load(0x1000'0000, {{0, 4096}}), CopyKind::host_to_device));
  CHECK(r.host_sides_inside(load(0x1008'0000, {{0, 4096}}), CopyKind::host_to_device));
  r.remove(at(0x1000'0004));  // not a range's start: nothing removed
  CHECK(r.size() == 1);
  // Empty and wrapping ranges are never added.
  r.add(at(0x5000'0000), 0);
  r.add(at(UINTPTR_MAX - 10), 4096);
  CHECK(r.size() == 1);
}
