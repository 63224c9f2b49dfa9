// find_grid: a batch is sent as rows x columns only where that lists every
// segment exactly; anything else (one byte count, one address off, the
// limits passed) is no grid and goes as listed. Pure: fake addresses.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <random>

#include "device/segment_grid.hpp"

using kvstrand::device::find_grid;
using kvstrand::device::kernel::KernelSegment;

namespace {

// A plane-major paged load: plane p's tensor at a base of its own, block b
// at a random id in it; on the host, each block in a chunk object at a
// random place, plane p at its offset in the object.
std::vector<KernelSegment> paged(std::size_t planes, std::size_t blocks, std::uint64_t block_bytes) {
  std::mt19937_64 rng(7);
  std::vector<std::uint64_t> ids(4 * blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<KernelSegment> s;
  for (std::size_t p = 0; p < planes; ++p) {
    const std::uint64_t tensor = 0x7f0000000000 + rng() % (1ull << 40) / 4096 * 4096;
    for (std::size_t b = 0; b < blocks; ++b) {
      const std::uint64_t object = 0x100000000 + (b / 16) * (1ull << 30);
      s.push_back({object + p * 16 * block_bytes + (b % 16) * block_bytes, tensor + ids[b] * block_bytes, block_bytes});
    }
  }
  return s;
}

// The grid, expanded again, row by row.
std::vector<KernelSegment> expand(const kvstrand::device::SegmentGrid& g) {
  std::vector<KernelSegment> s;
  for (std::size_t r = 0; r < g.rows(); ++r)
    for (const KernelSegment& c : g.columns) s.push_back({c.src + g.row_src[r], c.dst + g.row_dst[r], c.bytes});
  return s;
}

bool same(const std::vector<KernelSegment>& a, const std::vector<KernelSegment>& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](const KernelSegment& x, const KernelSegment& y) {
    return x.src == y.src && x.dst == y.dst && x.bytes == y.bytes;
  });
}

}  // namespace

TEST_CASE("grid: a 70B TP8 rank's paged load is 160 planes x 64 blocks, and lists every segment again",
          "[device][grid]") {
  const auto segs = paged(160, 64, 4096);
  const auto g = find_grid(segs.data(), segs.size(), 384, 768);
  REQUIRE(g);
  CHECK(g->rows() == 160);
  CHECK(g->columns.size() == 64);
  CHECK(same(expand(*g), segs));
}

TEST_CASE("grid: one segment off anywhere is no grid", "[device][grid]") {
  auto segs = paged(32, 64, 32 << 10);
  REQUIRE(find_grid(segs.data(), segs.size(), 384, 768));
  const std::size_t at = GENERATE(1, 63, 64, 65, 1000, 2047);
  SECTION("its bytes") { segs[at].bytes -= 16; }
  SECTION("its source") { segs[at].src += 16; }
  SECTION("its destination") { segs[at].dst -= 16; }
  INFO("segment " << at);
  CHECK_FALSE(find_grid(segs.data(), segs.size(), 384, 768));
}

TEST_CASE("grid: shuffled segments, too few, or past the limits are no grid", "[device][grid]") {
  auto segs = paged(160, 64, 4096);
  SECTION("shuffled") {
    std::shuffle(segs.begin(), segs.end(), std::mt19937(3));
    CHECK_FALSE(find_grid(segs.data(), segs.size(), 384, 768));
  }
  SECTION("one plane only: a single row") { CHECK_FALSE(find_grid(segs.data(), 64, 384, 768)); }
  SECTION("three segments") { CHECK_FALSE(find_grid(segs.data(), 3, 384, 768)); }
  SECTION("more rows than fit") { CHECK_FALSE(find_grid(segs.data(), segs.size(), 159, 768)); }
  SECTION("more columns than fit") { CHECK_FALSE(find_grid(segs.data(), segs.size(), 384, 63)); }
  SECTION("a segment short: the count is no multiple of the columns") {
    CHECK_FALSE(find_grid(segs.data(), segs.size() - 1, 384, 768));
  }
}

TEST_CASE("grid: rows below row 0 in memory wrap modulo 2^64 and come back exact", "[device][grid]") {
  std::vector<KernelSegment> segs;
  for (std::uint64_t r = 0; r < 5; ++r)  // each row lower than the one before, on both sides
    for (std::uint64_t c : {9u, 2u, 7u})
      segs.push_back({0x900000000 - r * 0x100000 + c * 0x1000, 0x500000000 - r * 0x200000 + c * 0x2000, 0x800});
  const auto g = find_grid(segs.data(), segs.size(), 8, 8);
  REQUIRE(g);
  CHECK(g->rows() == 5);
  CHECK(same(expand(*g), segs));
}

TEST_CASE("grid: of the grids that list the segments, the one with the fewest columns that fits",
          "[device][grid]") {
  // 4 x 6 is also 2 x 12 (pairs of rows moved by one offset) and 4 x 6:
  // with room for 4 rows, 6 columns; with room for 2 rows only, 12.
  std::vector<KernelSegment> segs;
  for (std::uint64_t r = 0; r < 4; ++r)
    for (std::uint64_t c = 0; c < 6; ++c)
      segs.push_back({r * 0x10000 + c * 0x100 * (c % 2 ? 3 : 5), r * 0x10000 + (6 - c) * 0x200, 0x40});
  const auto wide = find_grid(segs.data(), segs.size(), 2, 64);
  REQUIRE(wide);
  CHECK(wide->columns.size() == 12);
  CHECK(same(expand(*wide), segs));
  const auto narrow = find_grid(segs.data(), segs.size(), 64, 64);
  REQUIRE(narrow);
  CHECK(narrow->columns.size() == 6);
  CHECK(same(expand(*narrow), segs));
}
