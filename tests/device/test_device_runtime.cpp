// src/device's platform-neutral API against this build's backend. Tagged [gpu]:
// in a GPU build these same cases run on the GPU, or skip with a message.
#include <algorithm>
#include <atomic>
#include <numeric>
#include <random>
#include <thread>

#include "support.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using device::CopyKind;
using device::Errc;
using device::Segment;

TEST_CASE("backend reports itself and one device at least", "[device][gpu]") {
  const std::string backend = device::backend_name();
  REQUIRE((backend == "sim" || backend == "hip" || backend == "cuda"));
  if (!device_present()) return;
  auto name = must(device::device_name(0));
  INFO(name);
  REQUIRE(!name.empty());
}

TEST_CASE("allocations refuse zero bytes with a typed error", "[device][gpu]") {
  if (!device_present()) return;
  auto d = device::DeviceBuffer::allocate(0);
  REQUIRE_FALSE(d.ok());
  REQUIRE(d.status().code() == Errc::invalid_value);
  REQUIRE(d.status().call() == "DeviceBuffer::allocate");
  auto p = device::PinnedBuffer::allocate(0);
  REQUIRE(p.status().code() == Errc::invalid_value);
  REQUIRE_THROWS_AS(p.value(), device::DeviceError);
}

TEST_CASE("H2D then D2H round-trips random bytes exactly", "[device][gpu]") {
  if (!device_present()) return;
  auto s = must(device::Stream::create());
  const std::size_t n = (3u << 20) + 123;  // not a multiple of anything
  auto dev = must(device::DeviceBuffer::allocate(n));
  const auto data = random_bytes(n, 1);
  write_device(s, dev.data(), data);
  REQUIRE(read_device(s, dev.data(), n) == data);
}

TEST_CASE("D2D copies between and within allocations", "[device][gpu]") {
  if (!device_present()) return;
  auto s = must(device::Stream::create());
  const std::size_t n = 1 << 20;
  auto a = must(device::DeviceBuffer::allocate(n));
  auto b = must(device::DeviceBuffer::allocate(2 * n));
  const auto data = random_bytes(n, 2);
  write_device(s, a.data(), data);
  require_ok(device::copy_d2d(s, b.data() + n, a.data(), n));
  require_ok(device::copy_d2d(s, b.data(), b.data() + n, n / 2));
  require_ok(s.synchronize());
  REQUIRE(read_device(s, b.data() + n, n) == data);
  const auto head = read_device(s, b.data(), n / 2);
  REQUIRE(std::equal(head.begin(), head.end(), data.begin()));
}

TEST_CASE("batched copy moves scattered blocks byte for byte", "[device][gpu]") {
  if (!device_present()) return;
  auto s = must(device::Stream::create());
  // A pool of blocks on the device; save 7 scattered blocks to a contiguous
  // host staging area, overwrite the pool, restore into other block ids.
  const std::size_t block = 64 * 1024 + 40, blocks = 64;
  auto pool = must(device::DeviceBuffer::allocate(block * blocks));
  const auto original = random_bytes(block * blocks, 3);
  write_device(s, pool.data(), original);
  const std::vector<std::size_t> from = {3, 17, 18, 19, 40, 2, 63};
  const std::vector<std::size_t> to = {0, 5, 6, 7, 50, 51, 9};
  auto host = must(device::PinnedBuffer::allocate(block * from.size()));

  std::vector<Segment> save, load;
  for (std::size_t i = 0; i < from.size(); ++i) {
    save.push_back({pool.data() + from[i] * block, host.data() + i * block, block});
    load.push_back({host.data() + i * block, pool.data() + to[i] * block, block});
  }
  require_ok(device::copy_batch(s, CopyKind::device_to_host, save));
  require_ok(s.synchronize());
  write_device(s, pool.data(), random_bytes(block * blocks, 4));  // "evicted"
  require_ok(device::copy_batch(s, CopyKind::host_to_device, load));
  const auto after = read_device(s, pool.data(), block * blocks);
  for (std::size_t i = 0; i < from.size(); ++i) {
    INFO("block " << from[i] << " -> " << to[i]);
    REQUIRE(std::memcmp(after.data() + to[i] * block, original.data() + from[i] * block, block) == 0);
  }
}

TEST_CASE("every batch path moves the same bytes, aligned runs and odd ones, both directions", "[device][gpu]") {
  if (!device_present()) return;
  INFO("fastest batch path here: " << device::fastest_batch_path());
  auto s = must(device::Stream::create());
  constexpr std::size_t kBytes = 1 << 20;
  auto dev = must(device::DeviceBuffer::allocate(kBytes));
  auto host = must(device::PinnedBuffer::allocate(kBytes));
  // 16-byte multiples (the kernel's wide path) and odd offsets and lengths
  // (its byte path), none of them contiguous with the next.
  const std::vector<std::pair<std::size_t, std::size_t>> runs = {
      {0, 4096}, {8192, 147'968}, {200'001, 333}, {300'000, 17}, {400'016, 65'536}, {600'003, 1}, {700'000, 70'000}};
  for (const device::BatchPath path : {device::BatchPath::per_segment, device::BatchPath::fastest, device::BatchPath::dma_batch}) {
    device::set_batch_path(path);
    INFO("path " << static_cast<int>(path));
    const auto src = random_bytes(kBytes, 11 + static_cast<int>(path));
    std::memcpy(host.data(), src.data(), kBytes);
    write_device(s, dev.data(), std::vector<std::byte>(kBytes, std::byte{0}));
    std::vector<Segment> h2d, d2h;
    for (auto [off, n] : runs) {
      h2d.push_back({host.data() + off, dev.data() + (kBytes - off - n), n});  // mirrored placement
      d2h.push_back({dev.data() + (kBytes - off - n), host.data() + off, n});
    }
    require_ok(device::copy_batch(s, CopyKind::host_to_device, h2d));
    const auto on_device = read_device(s, dev.data(), kBytes);
    for (auto [off, n] : runs) REQUIRE(std::memcmp(on_device.data() + (kBytes - off - n), src.data() + off, n) == 0);
    std::memset(host.data(), 0, kBytes);
    require_ok(device::copy_batch(s, CopyKind::device_to_host, d2h));
    require_ok(s.synchronize());
    for (auto [off, n] : runs) REQUIRE(std::memcmp(host.data() + off, src.data() + off, n) == 0);
  }
  device::set_batch_path(device::BatchPath::fastest);
}

// Loads `count` segments, sizes taken in turn from `sizes`, and compares
// every byte. On the device they lie in reverse order (nothing coalesces;
// with sizes in turn, the segments are a grid: device/segment_grid.hpp) or in
// a shuffled order (no grid: the list itself goes to the kernel).
enum class Placement { reversed, shuffled };
static void load_many_segments_exactly(const std::vector<std::size_t>& sizes, int count, int seed,
                                       Placement placement = Placement::shuffled) {
  auto s = must(device::Stream::create());
  std::vector<std::size_t> offset(count + 1, 0);
  for (int i = 0; i < count; ++i) offset[i + 1] = offset[i] + ((sizes[i % sizes.size()] + 31) & ~std::size_t{15});
  const std::size_t total = offset[count];
  std::vector<std::size_t> dev_at(count);
  if (placement == Placement::reversed) {
    for (int i = 0; i < count; ++i) dev_at[i] = total - offset[i + 1];
  } else {
    std::vector<int> order(count);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(seed));
    std::size_t next = 0;
    for (int i : order) dev_at[i] = next, next += offset[i + 1] - offset[i];
  }
  auto host = must(device::PinnedBuffer::allocate(total));
  auto dev = must(device::DeviceBuffer::allocate(total));
  const auto src = random_bytes(total, seed);
  std::memcpy(host.data(), src.data(), total);
  write_device(s, dev.data(), std::vector<std::byte>(total, std::byte{0}));
  std::vector<Segment> h2d;
  for (int i = 0; i < count; ++i) h2d.push_back({host.data() + offset[i], dev.data() + dev_at[i], sizes[i % sizes.size()]});
  require_ok(device::copy_batch(s, CopyKind::host_to_device, h2d));
  const auto on_device = read_device(s, dev.data(), total);
  for (int i = 0; i < count; ++i) {
    INFO("segment " << i);
    REQUIRE(std::memcmp(on_device.data() + dev_at[i], src.data() + offset[i], h2d[i].bytes) == 0);
  }
}

// Over 1,024 segments the kernel reads its table from device memory, one
// launch: tiles where any segment is over 64 KiB, a warp a segment where
// none is. Below that, the table travels in launch parameters. A grid of
// segments of at most 64 KiB, over 256 of them, travels as its rows and
// columns in one launch's parameters.
TEST_CASE("the fastest load path moves thousands of segments, across tile edges, from a device table", "[device][gpu]") {
  if (!device_present()) return;
  // Sizes on both sides of a 16 KiB tile edge, small and large, 16-byte
  // multiples and odd ones.
  load_many_segments_exactly({4096, 16'384, 16'400, 32'768, 48, 70'001, 16'383, 1}, 2600, 21);
}

TEST_CASE("the fastest load path moves thousands of small segments, a warp each, from a device table", "[device][gpu]") {
  if (!device_present()) return;
  // None over 64 KiB: a paged layout's per-layer blocks, and odd ones.
  load_many_segments_exactly({4096, 65'536, 48, 1, 32'768, 4095, 17, 65'520}, 3000, 22);
}

TEST_CASE("the fastest load path moves a grid of small segments, its rows and columns in launch parameters",
          "[device][gpu][grid]") {
  if (!device_present()) return;
  SECTION("a large grid: 375 rows of 8 columns, odd sizes among them") {
    load_many_segments_exactly({4096, 65'536, 48, 1, 32'768, 4095, 17, 65'520}, 3000, 24, Placement::reversed);
  }
  SECTION("a small grid: 65 rows of 4") { load_many_segments_exactly({4096, 48, 4095, 32'768}, 260, 25, Placement::reversed); }
  SECTION("a paged layout's load, planned and sent as kvstrand sends it") {
    // 160 planes (80 layers x K,V) of 4 KiB blocks, 64 blocks at random
    // ids of a pool of 256 in each plane's tensor; on the host, 4 chunk
    // objects of 16 blocks, plane-major.
    constexpr std::size_t kPlanes = 160, kBlocks = 64, kPool = 256, kBlock = 4096;
    auto s = must(device::Stream::create());
    auto host = must(device::PinnedBuffer::allocate(kPlanes * kBlocks * kBlock));
    auto dev = must(device::DeviceBuffer::allocate(kPlanes * kPool * kBlock));
    const auto src = random_bytes(kPlanes * kBlocks * kBlock, 26);
    std::memcpy(host.data(), src.data(), src.size());
    write_device(s, dev.data(), std::vector<std::byte>(kPlanes * kPool * kBlock, std::byte{0}));
    std::vector<std::size_t> ids(kPool);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), std::mt19937(26));
    std::vector<Segment> h2d;
    for (std::size_t p = 0; p < kPlanes; ++p)
      for (std::size_t b = 0; b < kBlocks; ++b)
        h2d.push_back({host.data() + (b / 16) * kPlanes * 16 * kBlock + (p * 16 + b % 16) * kBlock,
                       dev.data() + (p * kPool + ids[b]) * kBlock, kBlock});
    require_ok(device::copy_batch(s, CopyKind::host_to_device, h2d));
    const auto on_device = read_device(s, dev.data(), kPlanes * kPool * kBlock);
    for (const Segment& g : h2d) {
      const auto from = static_cast<const std::byte*>(g.src) - host.data();
      INFO("segment from host offset " << from);
      REQUIRE(std::memcmp(on_device.data() + (static_cast<std::byte*>(g.dst) - dev.data()), src.data() + from, kBlock) == 0);
    }
  }
}

// `loads` loads of `segments` segments of `seg` bytes queued back to back,
// none waited for, each from its own region (host segments `host_stride`
// apart), to device slots two segments apart shuffled within the region,
// so that no load is a grid (which needs no table): each has a table of
// its own. Every byte compared once all were queued.
static void queue_shuffled_loads(int loads, int segments, std::size_t seg, std::size_t host_stride, unsigned seed) {
  auto s = must(device::Stream::create());
  const std::size_t region = segments * 2 * seg;
  auto host = must(device::PinnedBuffer::allocate(loads * region));
  auto dev = must(device::DeviceBuffer::allocate(loads * region));
  const auto src = random_bytes(loads * region, static_cast<int>(seed));
  std::memcpy(host.data(), src.data(), src.size());
  write_device(s, dev.data(), std::vector<std::byte>(src.size(), std::byte{0}));
  std::vector<std::vector<int>> slot(loads, std::vector<int>(segments));
  for (int l = 0; l < loads; ++l) {
    std::iota(slot[l].begin(), slot[l].end(), 0);
    std::shuffle(slot[l].begin(), slot[l].end(), std::mt19937(seed + l));
    std::vector<Segment> h2d;
    for (int i = 0; i < segments; ++i)
      h2d.push_back({host.data() + l * region + i * host_stride, dev.data() + l * region + slot[l][i] * 2 * seg, seg});
    require_ok(device::copy_batch(s, CopyKind::host_to_device, h2d));
  }
  const auto on_device = read_device(s, dev.data(), src.size());
  for (int l = 0; l < loads; ++l)
    for (int i = 0; i < segments; ++i) {
      INFO("load " << l << " segment " << i);
      REQUIRE(std::memcmp(on_device.data() + l * region + slot[l][i] * 2 * seg, src.data() + l * region + i * host_stride,
                          seg) == 0);
    }
}

// Each one's table, staged in stream-ordered device memory on the cuda
// backend, must be the one its kernel reads, never a later load's.
TEST_CASE("loads of thousands of segments queued back to back each move their own bytes", "[device][gpu]") {
  if (!device_present()) return;
  queue_shuffled_loads(24, 3000, 64, 128, 31);  // each segment 64 B apart from the next
}

// The same, each load long enough (16 MiB in 4 KiB segments) that the next
// ones are queued while it runs: the load-path probe's pattern. Tables the
// driver copied during the call were read with entries zeroed here on an
// H100 and the context was lost (docs/performance-history.md, twenty-ninth
// run).
TEST_CASE("long loads of thousands of segments queued behind each other each move their own bytes", "[device][gpu]") {
  if (!device_present()) return;
  const std::size_t seg = sim_hooks_present() ? 64 : 4096;  // the sim proves the same logic on less
  queue_shuffled_loads(6, 4096, seg, seg, 100);
}

TEST_CASE("the fastest load path moves segments in launch parameters, up to 1,024 of them", "[device][gpu]") {
  if (!device_present()) return;
  // Each size of the parameters' table at its edges (160, 256, 1,024).
  const int count = GENERATE(160, 161, 256, 257, 1024);
  INFO(count << " segments");
  load_many_segments_exactly({4096, 70'001, 48, 16'384}, count, 23);
}

TEST_CASE("the fastest load path moves segments of 1 MiB and more (the copy engines' share) exactly", "[device][gpu]") {
  if (!device_present()) return;
  auto s = must(device::Stream::create());
  const std::vector<std::size_t> sizes = {1 << 20, (1 << 20) + 16, (2 << 20) - 1};
  constexpr std::size_t kSlot = 3 << 20;
  auto host = must(device::PinnedBuffer::allocate(kSlot * sizes.size()));
  auto dev = must(device::DeviceBuffer::allocate(kSlot * sizes.size()));
  const auto src = random_bytes(kSlot * sizes.size(), 23);
  std::memcpy(host.data(), src.data(), src.size());
  write_device(s, dev.data(), std::vector<std::byte>(src.size(), std::byte{0}));
  std::vector<Segment> h2d;
  for (std::size_t i = 0; i < sizes.size(); ++i)  // reversed slots on the device
    h2d.push_back({host.data() + i * kSlot + 8, dev.data() + (sizes.size() - 1 - i) * kSlot, sizes[i]});
  require_ok(device::copy_batch(s, CopyKind::host_to_device, h2d));
  const auto on_device = read_device(s, dev.data(), src.size());
  for (std::size_t i = 0; i < sizes.size(); ++i)
    REQUIRE(std::memcmp(on_device.data() + (sizes.size() - 1 - i) * kSlot, src.data() + i * kSlot + 8, sizes[i]) == 0);
}

TEST_CASE("coalesce merges runs contiguous on both sides only", "[device]") {
  std::byte src[64], dst[64];
  const std::vector<Segment> segs = {
      {src, dst, 8},            // a run...
      {src + 8, dst + 8, 8},    // ...continued on both sides: merged
      {src + 16, dst + 32, 8},  // source continues, destination jumps: new run
      {src + 24, dst + 40, 0},  // empty: dropped
      {src + 24, dst + 40, 8},  // continues the previous run
  };
  const auto merged = device::coalesce(segs);
  REQUIRE(merged.size() == 2);
  REQUIRE(merged[0].bytes == 16);
  REQUIRE(merged[1].src == src + 16);
  REQUIRE(merged[1].dst == dst + 32);
  REQUIRE(merged[1].bytes == 16);
}

TEST_CASE("copies refuse a null pointer before anything is queued", "[device][gpu]") {
  if (!device_present()) return;
  auto s = must(device::Stream::create());
  auto dev = must(device::DeviceBuffer::allocate(4096));
  device::Status st = device::copy_h2d(s, dev.data(), nullptr, 16);
  REQUIRE(st.code() == Errc::invalid_value);
  REQUIRE(st.call() == "copy_h2d");
  const std::vector<Segment> segs = {{dev.data(), nullptr, 16}};
  REQUIRE(device::copy_batch(s, CopyKind::device_to_host, segs).code() == Errc::invalid_value);
}

TEST_CASE("an event never recorded is complete, a recorded one completes with its stream", "[device][gpu]") {
  if (!device_present()) return;
  auto s = must(device::Stream::create());
  auto ev = must(device::Event::create());
  require_ok(ev.query());
  auto dev = must(device::DeviceBuffer::allocate(1 << 20));
  auto host = must(device::PinnedBuffer::allocate(1 << 20));
  for (int round = 0; round < 3; ++round) {  // re-recording reuses the event
    require_ok(device::copy_d2h(s, host.data(), dev.data(), 1 << 20));
    require_ok(ev.record(s));
    require_ok(ev.synchronize());
    require_ok(ev.query());
    require_ok(s.query());
  }
}

namespace {
struct Order {
  std::atomic<int> next{0};
  int seen[2] = {-1, -1};
};
void first(void* p) {
  auto* o = static_cast<Order*>(p);
  o->seen[0] = o->next++;
}
void second(void* p) {
  auto* o = static_cast<Order*>(p);
  o->seen[1] = o->next++;
}
}  // namespace

TEST_CASE("host functions run in stream order after earlier work", "[device][gpu]") {
  if (!device_present()) return;
  auto s = must(device::Stream::create());
  Order o;
  require_ok(s.host_func(&first, &o));
  require_ok(s.host_func(&second, &o));
  require_ok(s.synchronize());
  REQUIRE(o.seen[0] == 0);
  REQUIRE(o.seen[1] == 1);
  REQUIRE(s.host_func(nullptr, nullptr).code() == Errc::invalid_value);
}

TEST_CASE("streams run concurrently and independently", "[device][gpu]") {
  if (!device_present()) return;
  auto a = must(device::Stream::create());
  auto b = must(device::Stream::create());
  const std::size_t n = 1 << 20;
  auto da = must(device::DeviceBuffer::allocate(n));
  auto db = must(device::DeviceBuffer::allocate(n));
  const auto xa = random_bytes(n, 5), xb = random_bytes(n, 6);
  write_device(a, da.data(), xa);
  write_device(b, db.data(), xb);
  REQUIRE(read_device(b, da.data(), n) == xa);
  REQUIRE(read_device(a, db.data(), n) == xb);
}
