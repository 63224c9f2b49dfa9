// What a server started on a named arena (--arena-path) found in it: the
// objects its earlier life committed, read from the arena's object tables
// into the index before the first client is answered.
#pragma once

#include <cstdint>
#include <string>

#include "tier/object_table.hpp"
#include "tier/size_classes.hpp"

namespace kvstrand::server {

struct Recovery {
  bool named = false;     // --arena-path
  bool reopened = false;  // the file was there, of this size
  std::uint64_t objects = 0;              // committed objects served again
  std::uint64_t dropped_uncommitted = 0;  // reservations the earlier server never committed
  // Entries whose checksum failed, duplicates, objects of a size no class
  // can take, and slabs whose header failed (one each).
  std::uint64_t dropped_corrupt = 0;
  double seconds = 0;                     // reading the tables
  std::string started_empty;              // non-empty: why the file could not be read and was made again
};

// Reads the tables into `classes` (empty: nothing is adopted, and
// `started_empty` says why the caller must start over).
Recovery recover(tier::ObjectTable& table, tier::SizeClasses& classes);

}  // namespace kvstrand::server
