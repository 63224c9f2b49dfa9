// Registration: every bound a spec or a registration carries is checked, one
// value past it is refused with a reason, and no size or index computed from
// one wraps (checked 64-bit arithmetic). Pure checks: no device memory is
// touched, so fake base addresses stand in for it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>

#include "device/copy.hpp"
#include "device/segment_grid.hpp"
#include "data_path/registration.hpp"

using namespace kvstrand;
using kvstrand::Registration;

namespace {

constexpr std::uint64_t kEdges[] = {0, 1, 1ull << 31, (1ull << 32) - 1, 1ull << 63};

void* fake(std::uintptr_t a) { return reinterpret_cast<void*>(a); }

// 16-token blocks in 64-token chunks, two planes of different pool sizes
// (the tighter one bounds block ids), 8 image slots.
Registration small() {
  Registration r;
  r.layout.model_id = "m";
  r.layout.layout_name = "l";
  r.layout.planes = {{"k", 256}, {"v", 512}};
  r.layout.block_tokens = 16;
  r.layout.chunk_tokens = 64;
  r.layout.checkpoint = {"ring", 128, 64};
  r.layout.dtype = "bf16";
  r.planes = {{fake(0x10000000), 40}, {fake(0x20000000), 32}};
  r.state = {fake(0x30000000), 8};
  return r;
}

kv::TransferSpec spec(kv::TokenRange t, std::vector<kv::BlockId> blocks, std::size_t keys,
                      std::vector<std::int32_t> slots = {}) {
  kv::TransferSpec s;
  s.request = "r";
  s.tokens = t;
  s.blocks = std::move(blocks);
  s.keys.resize(keys);
  s.with_state = !slots.empty();
  s.state_slots = std::move(slots);
  return s;
}

bool refused(const std::optional<std::string>& why, const std::string& says) {
  INFO("refusal: " << why.value_or("(accepted)"));
  return why && why->find(says) != std::string::npos;
}

// What HostTier plans for a copy (into a buffer of its own here).
std::vector<device::Segment> segments_of(const Registration& reg, const kv::TransferSpec& s,
                                         const std::vector<std::byte*>& objects, bool save,
                                         const std::vector<bool>& images) {
  std::vector<device::Segment> segs;
  data_path::segments_into(reg, s, objects, save, images, segs);
  return segs;
}

}  // namespace

TEST_CASE("registration: each bound of a spec refuses one value past it, and accepts the last value inside",
          "[reactor][registration]") {
  const Registration r = small();
  REQUIRE(!r.check());
  SECTION("block ids: the smaller plane's pool bounds them") {
    REQUIRE(!r.check_save(spec({0, 64}, {0, 1, 2, 31}, 1)));
    REQUIRE(refused(r.check_save(spec({0, 64}, {0, 1, 2, 32}, 1)), "block 32 is outside plane 'v'"));
    REQUIRE(!r.check_load(spec({0, 16}, {31}, 1)));
    REQUIRE(refused(r.check_load(spec({0, 16}, {32}, 1)), "block 32"));
    REQUIRE(refused(r.check_load(spec({0, 16}, {0xFFFFFFFFu}, 1)), "outside plane"));
  }
  SECTION("image slots") {
    REQUIRE(!r.check_save(spec({0, 64}, {0, 1, 2, 3}, 1, {7})));
    REQUIRE(refused(r.check_save(spec({0, 64}, {0, 1, 2, 3}, 1, {8})), "state slot 8"));
    REQUIRE(!r.check_load(spec({0, 64}, {0, 1, 2, 3}, 1, {7})));
    REQUIRE(refused(r.check_load(spec({0, 64}, {0, 1, 2, 3}, 1, {8})), "state slot 8"));
    REQUIRE(refused(r.check_load(spec({0, 64}, {0, 1, 2, 3}, 1, {std::numeric_limits<std::int32_t>::max()})),
                    "outside the state memory"));
    REQUIRE(refused(r.check_load(spec({0, 64}, {0, 1, 2, 3}, 1, {-1})), "one destination slot"));
    REQUIRE(refused(r.check_load(spec({0, 64}, {0, 1, 2, 3}, 1, {1, 2})), "one destination slot"));
    REQUIRE(refused(r.check_save(spec({0, 128}, {0, 1, 2, 3, 4, 5, 6, 7}, 2, {1})), "one slot per chunk"));
  }
  SECTION("the token range, the block count and the key count agree") {
    REQUIRE(refused(r.check_load(spec({16, 16}, {}, 0)), "empty token range"));
    REQUIRE(refused(r.check_load(spec({8, 32}, {0}, 1)), "block grid"));
    REQUIRE(refused(r.check_load(spec({0, 32}, {0}, 1)), "expected 2 blocks, got 1"));
    REQUIRE(refused(r.check_load(spec({0, 32}, {0, 1, 2}, 1)), "expected 2 blocks, got 3"));
    REQUIRE(!r.check_load(spec({48, 80}, {0, 1}, 2)));  // touches chunks 0 and 1
    REQUIRE(refused(r.check_load(spec({48, 80}, {0, 1}, 1)), "expected 2 chunk keys, got 1"));
    REQUIRE(refused(r.check_load(spec({48, 80}, {0, 1}, 3)), "expected 2 chunk keys, got 3"));
    REQUIRE(refused(r.check_save(spec({16, 80}, {0, 1, 2, 3}, 2)), "whole chunks"));
    REQUIRE(refused(r.check_load(spec({0, 48}, {0, 1, 2}, 1, {0})), "ends on a chunk boundary"));
  }
}

TEST_CASE("registration: a range ending near 2^32 does not wrap to an empty key list", "[reactor][registration]") {
  // Blocks of 2^19 tokens in chunks of 2^20 (kv::kMaxChunkTokens): tokens
  // [0, 2^32 - 2^19) are 8191 blocks touching 4096 chunks. In 32 bits,
  // end + chunk - 1 wraps and the range seemed to need 4095 keys.
  Registration r = small();
  r.layout.block_tokens = 1u << 19;
  r.layout.chunk_tokens = kv::kMaxChunkTokens;
  r.layout.checkpoint = {};
  r.planes = {{fake(0x10000000), 8192}, {fake(0x20000000), 8192}};
  REQUIRE(!r.check());
  const kv::TokenRange t{0, static_cast<std::uint32_t>((1ull << 32) - (1ull << 19))};
  std::vector<kv::BlockId> blocks(8191);
  for (std::uint32_t i = 0; i < blocks.size(); ++i) blocks[i] = i;
  REQUIRE(refused(r.check_load(spec(t, blocks, 4095)), "expected 4096 chunk keys, got 4095"));
  REQUIRE(!r.check_load(spec(t, blocks, 4096)));
}

TEST_CASE("registration: sizes at the edges (0, 1, 2^31, 2^32-1, 2^63) are refused where they would wrap",
          "[reactor][registration][property]") {
  for (std::uint64_t bytes : kEdges) {
    for (std::uint64_t image : kEdges) {
      for (std::uint64_t blocks : kEdges) {
        Registration r = small();
        r.layout.planes = {{"k", bytes}, {"v", bytes}};
        r.layout.checkpoint.image_bytes = image;
        if (image == 0) r.layout.checkpoint = {};
        if (blocks > std::numeric_limits<std::uint32_t>::max()) continue;
        r.planes = {{fake(0x10000000), static_cast<std::uint32_t>(blocks)},
                    {fake(0x20000000), static_cast<std::uint32_t>(blocks)}};
        const auto err = kv::validate(r.layout);
        const auto why = r.check();
        INFO("bytes_per_block " << bytes << ", image_bytes " << image << ", num_blocks " << blocks << ": "
                                << why.value_or("accepted"));
        // What is accepted has every derived size exact in 64 bits and every
        // plane's and the state's memory inside the address space.
        const unsigned __int128 per_block = static_cast<unsigned __int128>(bytes) * 2;
        const unsigned __int128 object = per_block * r.layout.blocks_per_chunk() + image;
        const bool fits = bytes != 0 && object <= std::numeric_limits<std::uint64_t>::max();
        REQUIRE(err.has_value() == !fits);
        if (!fits) {
          REQUIRE(why.has_value());
          continue;
        }
        REQUIRE(r.object_bytes() == static_cast<std::uint64_t>(object));
        const unsigned __int128 plane_end = 0x20000000 + static_cast<unsigned __int128>(blocks) * bytes;
        const unsigned __int128 state_end = 0x30000000 + static_cast<unsigned __int128>(8) * image;
        const bool memory_fits = blocks != 0 && plane_end <= std::numeric_limits<std::uintptr_t>::max() &&
                                 state_end <= std::numeric_limits<std::uintptr_t>::max();
        REQUIRE(why.has_value() == !memory_fits);
      }
    }
  }
}

TEST_CASE("registration: one with no memory at all serves lookups only, and its saves and loads are refused",
          "[reactor][registration]") {
  Registration r = small();
  r.planes.clear();
  r.state = {};
  REQUIRE(r.lookup_only());
  REQUIRE_FALSE(r.check().has_value());
  const auto s = spec({0, 64}, {0, 1, 2, 3}, 1, {-1});
  REQUIRE(r.check_save(s).value_or("") == "its registration has no device memory: it serves lookups only");
  REQUIRE(r.check_load(s).value_or("") == "its registration has no device memory: it serves lookups only");
  // Some memory but not all is a mistake, not a lookup-only registration.
  Registration half = small();
  half.planes.pop_back();
  REQUIRE_FALSE(half.lookup_only());
  REQUIRE(half.check().has_value());
  Registration no_state = small();
  no_state.state = {};
  REQUIRE_FALSE(no_state.lookup_only());
  REQUIRE(no_state.check().value_or("").find("no state memory") != std::string::npos);
  // A lookup-only registration's layout is still validated.
  r.layout.block_tokens = 0;
  REQUIRE(r.check().has_value());
}

// Two state memories (a hybrid engine's state layers, each with its own pool
// and slot ids: vLLM's Mamba groups): an image is memory 0's slot bytes then
// memory 1's, a spec names a slot in each.
TEST_CASE("registration: an image kept in two state memories takes one slot in each, in the image's order",
          "[reactor][registration]") {
  Registration r = small();
  r.state = {};
  r.state_parts = {{fake(0x30000000), 8, 96}, {fake(0x40000000), 4, 32}};  // 96 + 32 = the image's 128 bytes
  REQUIRE(!r.check());
  REQUIRE(r.state_part_count() == 2);
  SECTION("the memories must add up to the image, and come one way only") {
    Registration bad = r;
    bad.state_parts[1].slot_bytes = 33;
    REQUIRE(refused(bad.check(), "add up to 129 bytes"));
    bad = r;
    bad.state_parts[1].slot_bytes = 0;
    REQUIRE(refused(bad.check(), "state_parts[1] has no device memory"));
    bad = r;
    bad.state = {fake(0x50000000), 8};
    REQUIRE(refused(bad.check(), "not both"));
    bad = small();
    bad.state.slot_bytes = 64;
    REQUIRE(refused(bad.check(), "slot_bytes 64 is not the image's 128 bytes"));
  }
  SECTION("a save names a slot per chunk and memory; each memory bounds its own") {
    REQUIRE(!r.check_save(spec({0, 128}, {0, 1, 2, 3, 4, 5, 6, 7}, 2, {-1, -1, 7, 3})));
    REQUIRE(refused(r.check_save(spec({0, 128}, {0, 1, 2, 3, 4, 5, 6, 7}, 2, {-1, 3})), "per chunk and state memory"));
    REQUIRE(refused(r.check_save(spec({0, 128}, {0, 1, 2, 3, 4, 5, 6, 7}, 2, {-1, -1, 7, 4})),
                    "state slot 4 is outside the state memory state_parts[1]"));
    REQUIRE(refused(r.check_save(spec({0, 128}, {0, 1, 2, 3, 4, 5, 6, 7}, 2, {-1, 2, 7, 3})),
                    "chunk 0 names an image slot in some state memories"));
    REQUIRE(!r.check_load(spec({0, 64}, {0, 1, 2, 3}, 1, {7, 3})));
    REQUIRE(refused(r.check_load(spec({0, 64}, {0, 1, 2, 3}, 1, {7})), "one destination slot per state memory"));
    REQUIRE(refused(r.check_load(spec({0, 64}, {0, 1, 2, 3}, 1, {7, -1})), "one destination slot per state memory"));
  }
  SECTION("segments: each memory's slot to its place in the image, after the blocks") {
    std::vector<std::byte> objects(2 * r.object_bytes());
    std::vector<std::byte*> at{objects.data(), objects.data() + r.object_bytes()};
    const auto save =
        segments_of(r, spec({0, 128}, {0, 1, 2, 3, 4, 5, 6, 7}, 2, {-1, -1, 5, 3}), at, true, {false, true});
    REQUIRE(save.size() == 8 * 2 + 2);  // two planes' blocks, then the one image in two pieces
    const auto& first = save[save.size() - 2];
    const auto& second = save.back();
    REQUIRE(first.src == fake(0x30000000 + 5 * 96));
    REQUIRE(first.dst == at[1] + r.image_offset());
    REQUIRE(first.bytes == 96);
    REQUIRE(second.src == fake(0x40000000 + 3 * 32));
    REQUIRE(second.dst == at[1] + r.image_offset() + 96);
    REQUIRE(second.bytes == 32);
    const auto load = segments_of(r, spec({0, 64}, {0, 1, 2, 3}, 1, {2, 1}), {at[0]}, false, {true});
    REQUIRE(load.back().src == at[0] + r.image_offset() + 96);
    REQUIRE(load.back().dst == fake(0x40000000 + 1 * 32));
  }
  SECTION("the Connector counts the slots of every memory apart") {
    REQUIRE(data_path::state_slot_count(r) == 12);
    const auto s = spec({0, 128}, {0, 1, 2, 3, 4, 5, 6, 7}, 2, {1, 1, 5, 3});
    std::vector<std::int32_t> used;
    data_path::any_slot_use(r, s, [&](std::int32_t slot) {
      used.push_back(slot);
      return false;
    });
    REQUIRE(used == std::vector<std::int32_t>{1, 9, 5, 11});
    REQUIRE(data_path::images_of(r, s) == 2);
  }
}

TEST_CASE("registration: a paged layout's load, as planned and coalesced, is a grid of planes x blocks",
          "[reactor][registration][grid]") {
  // A 70B TP8 rank: 80 layers x K,V of 4 KiB blocks, 64 blocks in 4 chunks,
  // the block ids scattered over the pool (device::kernel::segment_copy sends
  // such a load as one launch with its grid in the parameters).
  Registration r;
  r.layout.model_id = "m";
  r.layout.layout_name = "paged";
  r.layout.block_tokens = 16;
  r.layout.chunk_tokens = 256;
  r.layout.dtype = "bf16";
  for (int p = 0; p < 160; ++p) {
    r.layout.planes.push_back({"p" + std::to_string(p), 4096});
    r.planes.push_back({fake(0x7f0000000000 + std::uintptr_t(p) * 0x3000000 + (p % 7) * 0x1000), 4096});
  }
  REQUIRE(!r.check());
  std::vector<kv::BlockId> blocks(4096);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), std::mt19937(5));
  blocks.resize(64);
  const auto s = spec({0, 1024}, blocks, 4);
  REQUIRE(!r.check_load(s));
  const std::vector<std::byte*> objects{static_cast<std::byte*>(fake(0x200000000)), static_cast<std::byte*>(fake(0x900000000)),
                                        static_cast<std::byte*>(fake(0x500000000)), static_cast<std::byte*>(fake(0x300000000))};
  const auto planned = device::coalesce(segments_of(r, s, objects, false, {false, false, false, false}));
  std::vector<device::kernel::KernelSegment> table;
  for (const device::Segment& g : planned)
    table.push_back({reinterpret_cast<std::uint64_t>(g.src), reinterpret_cast<std::uint64_t>(g.dst), g.bytes});
  const auto grid = device::find_grid(table.data(), table.size(), 384, 768);
  REQUIRE(grid);
  CHECK(grid->rows() == 160);
  CHECK(grid->columns.size() * 160 == table.size());
  for (std::size_t i = 0; i < table.size(); ++i) {
    const auto& c = grid->columns[i % grid->columns.size()];
    INFO("segment " << i);
    REQUIRE(c.src + grid->row_src[i / grid->columns.size()] == table[i].src);
    REQUIRE(c.dst + grid->row_dst[i / grid->columns.size()] == table[i].dst);
    REQUIRE(c.bytes == table[i].bytes);
  }
}
