#include "device/segment_grid.hpp"

#include <algorithm>

namespace kvstrand::device {
namespace {

using kernel::KernelSegment;

// Whether row `r` of a grid of `cols` columns is row 0 moved by one offset
// on each side, over columns [from, to).
bool row_matches(const KernelSegment* s, std::size_t cols, std::size_t r, std::size_t from, std::size_t to) {
  const KernelSegment* row = s + r * cols;
  const std::uint64_t ds = row[0].src - s[0].src, dd = row[0].dst - s[0].dst;
  for (std::size_t c = from; c < to; ++c)
    if (row[c].src != s[c].src + ds || row[c].dst != s[c].dst + dd || row[c].bytes != s[c].bytes) return false;
  return true;
}

}  // namespace

std::optional<SegmentGrid> find_grid(const KernelSegment* segments, std::size_t count, std::size_t max_rows,
                                     std::size_t max_cols) {
  if (count < 4 || max_rows < 2 || max_cols < 2) return std::nullopt;
  const std::size_t first = std::max<std::size_t>(2, (count + max_rows - 1) / max_rows);
  const std::size_t last = std::min(max_cols, count / 2);
  for (std::size_t cols = first; cols <= last; ++cols) {
    if (count % cols != 0) continue;
    // A few columns of row 1 rule most column counts out before the pass.
    if (!row_matches(segments, cols, 1, 1, std::min<std::size_t>(cols, 4))) continue;
    const std::size_t rows = count / cols;
    bool grid = true;
    for (std::size_t r = 1; r < rows && grid; ++r) grid = row_matches(segments, cols, r, 0, cols);
    if (!grid) continue;
    SegmentGrid g;
    g.columns.assign(segments, segments + cols);
    g.row_src.resize(rows);
    g.row_dst.resize(rows);
    for (std::size_t r = 0; r < rows; ++r) {
      g.row_src[r] = segments[r * cols].src - segments[0].src;
      g.row_dst[r] = segments[r * cols].dst - segments[0].dst;
    }
    return g;
  }
  return std::nullopt;
}

}  // namespace kvstrand::device
