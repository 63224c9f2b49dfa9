// A batch of segments that is a grid: rows x columns, segment (r, c) being
// column c moved by row r's offsets on each side, listed row by row. A paged
// layout's load is one as kvstrand plans it (tier/object_format.hpp): a row
// a plane (its device tensor, its offset in each chunk object), a column a
// block (its block id, its chunk object). The grid is rows + columns
// entries where the list is rows x columns: a 70B TP8 rank's 10,240
// segments are 160 + 64, small enough to travel in a kernel launch's
// parameters, so no table is built, copied or staged for the device.
// Plain C++ (no CUDA): the kernel's file calls it, the sim build tests it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "device/segment_copy_kernel.hpp"

namespace kvstrand::device {

struct SegmentGrid {
  // Row r's offsets, added to every column's src and dst (row 0's are 0;
  // the sums wrap modulo 2^64, as the addresses' differences were taken).
  std::vector<std::uint64_t> row_src, row_dst;
  // Row 0's segments: each column's src, dst and bytes.
  std::vector<kernel::KernelSegment> columns;
  std::size_t rows() const { return row_src.size(); }
};

// The grid of at least two rows and two columns that lists `segments`
// exactly, with the fewest columns that fit in max_rows and max_cols;
// nullopt where there is none. One pass over the segments for the grid
// found, and a few compares for each column count ruled out.
std::optional<SegmentGrid> find_grid(const kernel::KernelSegment* segments, std::size_t count, std::size_t max_rows,
                                     std::size_t max_cols);

}  // namespace kvstrand::device
