// Fixed-size fields of the formats kvstrand keeps in memory or on disk for
// a later server (object tables, disk extents), stored and read through
// memcpy: their places need not be aligned. Host byte order: such a format
// is read back on the machine that wrote it.
#pragma once

#include <cstddef>
#include <cstring>

namespace kvstrand::tier {

template <class T>
void put_field(std::byte* p, T v) {
  std::memcpy(p, &v, sizeof v);
}
template <class T>
T get_field(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace kvstrand::tier
