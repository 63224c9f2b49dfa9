// A load's path chosen by measurement (device/load_path.hpp): the choice rule,
// the class a batch falls in, the probe against a sim host where one path is
// slow for some sizes, and copy_batch following what was chosen. The
// Connector's option: tests/connector/test_connector_load_path.cpp.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <span>
#include <tuple>

#include "device/load_path.hpp"
#include "load_path_reset.hpp"
#include "device/load_path_probe.hpp"
#include "support.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;
using device::LoadPath;

namespace {

// `n` segments of `size` bytes, host side contiguous, each device segment
// one segment's length apart from the last (nothing coalesces).
std::vector<device::Segment> scattered(const device::PinnedBuffer& host, const device::DeviceBuffer& dev, std::size_t n,
                                    std::size_t size) {
  std::vector<device::Segment> segs;
  for (std::size_t i = 0; i < n; ++i) segs.push_back({host.data() + i * size, dev.data() + 2 * i * size, size});
  return segs;
}

}  // namespace

TEST_CASE("load path: the faster path is chosen, the copy engines only where more than 3 % faster, an unavailable "
          "path never",
          "[load_path]") {
  CHECK(device::choose(30, 50) == LoadPath::dma_batch);
  CHECK(device::choose(50, 30) == LoadPath::kernel);
  CHECK(device::choose(50, 51) == LoadPath::kernel);     // 2 % faster: a tie, the kernel's (the probe's error)
  CHECK(device::choose(50, 52) == LoadPath::dma_batch);  // 4 % faster: the copy engines'
  CHECK(device::choose(50, 49) == LoadPath::kernel);
  CHECK(device::choose(50, 0) == LoadPath::kernel);
  CHECK(device::choose(0, 10) == LoadPath::dma_batch);
  CHECK(device::choose(0, 0) == LoadPath::kernel);  // neither measured: the kernel, as the built-in rule loads
}

TEST_CASE("load path: a segment size takes the choice of the class nearest it, on a log scale",
          "[load_path]") {
  device::LoadPaths p;
  p.classes = {{4096, 0, 0, LoadPath::kernel}, {128 << 10, 0, 0, LoadPath::dma_batch}, {1 << 20, 0, 0, LoadPath::kernel}};
  CHECK(p.path_for(4096) == LoadPath::kernel);
  CHECK(p.path_for(148 << 10) == LoadPath::dma_batch);  // the reference load's segments
  CHECK(p.path_for(10 << 10) == LoadPath::kernel);      // 2^13.3: nearer 2^12 than 2^17
  CHECK(p.path_for(40 << 10) == LoadPath::dma_batch);   // 2^15.3: nearer 2^17 (though nearer 4 KiB in bytes)
  CHECK(p.path_for(300 << 10) == LoadPath::dma_batch);  // 2^18.2: nearer 2^17 than 2^20
  CHECK(p.path_for(700 << 10) == LoadPath::kernel);     // 2^19.5
  CHECK(p.path_for(1ull << 30) == LoadPath::kernel);    // past the largest
  CHECK(p.path_for(0) == LoadPath::kernel);             // below the smallest
  p.how = "measured";
  const std::string said = p.describe();
  CHECK(said.find("4 KiB kernel") != std::string::npos);
  CHECK(said.find("128 KiB dma-batch") != std::string::npos);
  CHECK(said.find("1 MiB kernel") != std::string::npos);
  CHECK(said.rfind("measured:", 0) == 0);
  CHECK(said.back() == ')');  // the last class's figures close the line
  CHECK(device::LoadPaths{}.path_for(4096) == LoadPath::kernel);  // no class: the kernel
}

// An H100's probe (docs/performance-history.md, twenty-ninth run): where
// the copy engines win for large segments and lose far for small ones.
static device::LoadPaths h100_table() {
  device::LoadPaths p;
  const std::vector<std::tuple<std::uint64_t, double, double>> rates = {
      {4 << 10, 47.3, 5.7},     {8 << 10, 47.9, 6.6},     {16 << 10, 49.1, 9.5},    {32 << 10, 49.4, 33.2},
      {64 << 10, 49.9, 44.9},   {128 << 10, 50.1, 49.2},  {256 << 10, 50.2, 52.1},  {512 << 10, 50.0, 53.1},
      {1 << 20, 50.2, 53.8},    {2 << 20, 50.2, 54.3},    {4 << 20, 50.2, 54.4}};
  for (auto [bytes, kernel, dma] : rates) p.classes.push_back({bytes, kernel, dma, device::choose(kernel, dma)});
  return p;
}

TEST_CASE("load path: a batch's path weighs its segments' sizes by their bytes: a mixed batch is not its mean size",
          "[load_path]") {
  const device::LoadPaths p = h100_table();
  auto batch = [](std::vector<std::pair<std::uint64_t, int>> sizes) {
    std::vector<device::Segment> segs;
    for (auto [bytes, n] : sizes)
      for (int i = 0; i < n; ++i) segs.push_back({nullptr, nullptr, bytes});
    return segs;
  };
  // bench_gather's hybrid: 256 K,V blocks of 32 KiB, then 28 layers' 96 KiB
  // and 2 MiB states. Its mean segment (218 KiB) is the 256 KiB class's,
  // where the copy engines win by 4 %; the batch by the copy engines is
  // a tie (their 32 KiB blocks run at 33 GB/s): the kernel's. On that H100
  // the kernel loaded it at 1.095 of one copy, the DMA batch at 1.189.
  std::vector<device::Segment> hybrid = batch({{32 << 10, 256}});
  for (int layer = 0; layer < 28; ++layer) {
    hybrid.push_back({nullptr, nullptr, 96 << 10});
    hybrid.push_back({nullptr, nullptr, 2 << 20});
  }
  std::uint64_t bytes = 0;
  for (const device::Segment& g : hybrid) bytes += g.bytes;
  CHECK(p.path_for(bytes / hybrid.size()) == LoadPath::dma_batch);
  CHECK(p.path_for(std::span<const device::Segment>(hybrid)) == LoadPath::kernel);
  // One size: its class's choice.
  CHECK(p.path_for(std::span<const device::Segment>(batch({{148 << 10, 141}}))) == LoadPath::kernel);  // 128 KiB: a tie
  CHECK(p.path_for(std::span<const device::Segment>(batch({{2 << 20, 10}}))) == LoadPath::dma_batch);
  CHECK(p.path_for(std::span<const device::Segment>(batch({{4 << 10, 10'240}}))) == LoadPath::kernel);
  // Large segments with a few small ones: the bytes decide.
  CHECK(p.path_for(std::span<const device::Segment>(batch({{2 << 20, 40}, {4 << 10, 2}}))) == LoadPath::dma_batch);
  // A forced path stands whatever the sizes.
  device::LoadPaths forced;
  forced.classes = {{1, 0, 0, LoadPath::dma_batch}};
  CHECK(forced.path_for(std::span<const device::Segment>(hybrid)) == LoadPath::dma_batch);
  CHECK(device::LoadPaths{}.path_for(std::span<const device::Segment>(hybrid)) == LoadPath::kernel);
}

TEST_CASE("load path: the option's words", "[load_path]") {
  CHECK(device::parse_load_path("rule") == device::LoadPathOption::rule);
  CHECK(device::parse_load_path("measure") == device::LoadPathOption::measure);
  CHECK(device::parse_load_path("kernel") == device::LoadPathOption::kernel);
  CHECK(device::parse_load_path("dma-batch") == device::LoadPathOption::dma_batch);
  for (const char* bad : {"", "dma_batch", "Kernel", "fastest", "measure "}) CHECK_FALSE(device::parse_load_path(bad));
}

TEST_CASE("load path: the probe finds the kernel faster for small segments and the DMA batch for large ones on a "
          "host where that is so",
          "[load_path][sim]") {
  if (!sim_hooks_present()) return;
  LoadPathReset reset;
  // The copy engines pay per segment, the SMs per byte: 4 KiB segments by
  // the DMA batch cost 128 x 40 us a copy against the kernel's 2 ms; 128
  // KiB segments 4 x 40 us against the same 2 ms.
  CHECK(device::sim::set_load_path_cost(LoadPath::dma_batch, -1us, 0ns).code() == device::Errc::invalid_value);
  CHECK(device::sim::set_load_path_cost(LoadPath::dma_batch, 0ns, -1ns).code() == device::Errc::invalid_value);
  require_ok(device::sim::set_load_path_cost(LoadPath::dma_batch, 40us, 0ns));
  require_ok(device::sim::set_load_path_cost(LoadPath::kernel, 0ns, 4ms));
  device::LoadPathProbeOptions o;
  o.segment_bytes = {4096, 128 << 10, 1 << 20};  // 1 MiB does not fit twice in 512 KiB: skipped
  o.probe_bytes = 512 << 10;
  const auto kernel_before = device::sim::batches_by(LoadPath::kernel);
  const auto dma_before = device::sim::batches_by(LoadPath::dma_batch);
  auto got = device::measure_load_paths(o);
  require_ok(got.status());
  REQUIRE(got->classes.size() == 2);
  CHECK(got->classes[0].segment_bytes == 4096);
  CHECK(got->classes[0].chosen == LoadPath::kernel);
  CHECK(got->classes[0].kernel_gbps > got->classes[0].dma_batch_gbps);
  CHECK(got->classes[1].segment_bytes == (128 << 10));
  CHECK(got->classes[1].chosen == LoadPath::dma_batch);
  CHECK(got->classes[1].dma_batch_gbps > got->classes[1].kernel_gbps);
  // Each path ran: a warm-up copy, then rounds x copies, for each size.
  const std::uint64_t each = 2 * (1 + o.rounds * o.copies_per_round);
  CHECK(device::sim::batches_by(LoadPath::kernel) - kernel_before == each);
  CHECK(device::sim::batches_by(LoadPath::dma_batch) - dma_before == each);
  CHECK(got->how.find(" s") != std::string::npos);
}

TEST_CASE("load path: copy_batch sends a load by the path chosen for its segments' size, saves and an unset choice "
          "by the built-in rule, every byte in place",
          "[load_path][sim]") {
  if (!sim_hooks_present()) return;
  LoadPathReset reset;
  auto s = must(device::Stream::create());
  auto host = must(device::PinnedBuffer::allocate(1 << 20));
  auto dev = must(device::DeviceBuffer::allocate(2 << 20));
  for (std::size_t i = 0; i < host.size(); ++i) host.data()[i] = static_cast<std::byte>(i * 7 + 3);
  device::LoadPaths p;
  p.classes = {{4096, 0, 0, LoadPath::kernel}, {128 << 10, 0, 0, LoadPath::dma_batch}};
  p.how = "test";
  device::set_load_paths(p);
  REQUIRE(device::load_paths() != nullptr);
  const auto count = [] {
    return std::pair{device::sim::batches_by(LoadPath::kernel), device::sim::batches_by(LoadPath::dma_batch)};
  };
  auto [k0, d0] = count();
  require_ok(device::copy_batch(s, device::CopyKind::host_to_device, scattered(host, dev, 16, 4096)));
  CHECK(count() == std::pair{k0 + 1, d0});
  require_ok(device::copy_batch(s, device::CopyKind::host_to_device, scattered(host, dev, 4, 128 << 10)));
  CHECK(count() == std::pair{k0 + 1, d0 + 1});
  require_ok(s.synchronize());
  for (std::size_t i = 0; i < 4; ++i)  // the last copy's bytes, each segment where it was sent
    REQUIRE(std::memcmp(dev.data() + 2 * i * (128 << 10), host.data() + i * (128 << 10), 128 << 10) == 0);
  // A save (device to host) is not a load: the built-in rule.
  std::vector<device::Segment> back;
  for (std::size_t i = 0; i < 16; ++i) back.push_back({dev.data() + 2 * i * 4096, host.data() + i * 4096, 4096});
  require_ok(device::copy_batch(s, device::CopyKind::device_to_host, back));
  CHECK(count() == std::pair{k0 + 1, d0 + 1});
  // Nothing chosen: the built-in rule.
  device::set_load_paths(std::nullopt);
  require_ok(device::copy_batch(s, device::CopyKind::host_to_device, scattered(host, dev, 16, 4096)));
  CHECK(count() == std::pair{k0 + 1, d0 + 1});
  require_ok(s.synchronize());
}

TEST_CASE("load path: a registration's sizes are probed once a process, the general classes with the first, a "
          "forced path replaces them, the sim's paths alike are not measured",
          "[load_path][sim]") {
  if (!sim_hooks_present()) return;
  LoadPathReset reset;
  device::forget_load_paths();
  // Both paths cost the same: nothing to choose, the built-in rule stays.
  require_ok(device::use_load_path(device::LoadPathOption::measure, 0));
  require_ok(device::measure_load_paths_for({2048}, 0));
  CHECK(device::load_paths() == nullptr);
  require_ok(device::sim::set_load_path_cost(LoadPath::dma_batch, 5us, 0ns));
  // A Connector's construction measures nothing; its registration does.
  require_ok(device::use_load_path(device::LoadPathOption::measure, 0));
  CHECK(device::load_paths() == nullptr);
  require_ok(device::measure_load_paths_for({2048, 147'968}, 0));
  const device::LoadPaths* measured = device::load_paths();
  REQUIRE(measured != nullptr);
  CHECK(measured->how.rfind("measured on device 0 in ", 0) == 0);
  const std::size_t general = device::LoadPathProbeOptions::default_segment_sizes().size();
  REQUIRE(measured->classes.size() == general + 2);
  CHECK(std::is_sorted(measured->classes.begin(), measured->classes.end(),
                       [](const auto& a, const auto& b) { return a.segment_bytes < b.segment_bytes; }));
  CHECK(measured->path_for(2048) == LoadPath::kernel);  // 8192 segments x 5 us by the copy engines
  // A size measured already is not probed again; a new one alone is.
  const auto probed = device::sim::batches_by(LoadPath::dma_batch);
  require_ok(device::measure_load_paths_for({2048, 147'968}, 0));
  CHECK(device::sim::batches_by(LoadPath::dma_batch) == probed);
  CHECK(device::load_paths() == measured);
  require_ok(device::measure_load_paths_for({3000}, 0));
  const device::LoadPathProbeOptions o;
  CHECK(device::sim::batches_by(LoadPath::dma_batch) - probed == 1u + o.rounds * o.copies_per_round);
  REQUIRE(device::load_paths()->classes.size() == general + 3);
  // Forced: as asked, and a registration then measures nothing.
  require_ok(device::use_load_path(device::LoadPathOption::dma_batch, 0));
  REQUIRE(device::load_paths() != nullptr);
  CHECK(device::load_paths()->how == "load_path=dma-batch");
  CHECK(device::load_paths()->path_for(4096) == LoadPath::dma_batch);
  const auto forced = device::sim::batches_by(LoadPath::dma_batch);
  require_ok(device::measure_load_paths_for({5000}, 0));
  CHECK(device::sim::batches_by(LoadPath::dma_batch) == forced);
  CHECK(device::load_paths()->how == "load_path=dma-batch");
  // The rule: nothing, and nothing measured.
  require_ok(device::use_load_path(device::LoadPathOption::rule, 0));
  CHECK(device::load_paths() == nullptr);
  require_ok(device::measure_load_paths_for({6000}, 0));
  CHECK(device::load_paths() == nullptr);
  // Measure again: what was measured, not a second probe.
  require_ok(device::use_load_path(device::LoadPathOption::measure, 0));
  REQUIRE(device::load_paths() != nullptr);
  CHECK(device::load_paths()->classes.size() == general + 3);
  CHECK(device::sim::batches_by(LoadPath::dma_batch) == forced);
}

// On a GPU, the probe's own copies: its layout for each size (the general
// classes and sizes a registration brings: a paged block, the reference
// load's chunk plane, odd ones) copied by each path lands byte for byte,
// and the probe of that size alone runs clean. An H100 lost its context to
// an illegal address in the probe once (docs/performance-history.md,
// twenty-eighth run): this names the size and the path.
TEST_CASE("load path: the probe's copies land byte for byte by each path, and the probe runs clean, each size alone",
          "[load_path][gpu]") {
  if (!device_present()) return;
  LoadPathReset reset;
  std::vector<std::uint64_t> sizes = device::LoadPathProbeOptions::default_segment_sizes();
  for (std::uint64_t odd : {2048u, 147'968u, 16'400u, 1000u, 4'194'304u + 16u}) sizes.push_back(odd);
  device::LoadPathProbeOptions o;
  // The probe's own size on a GPU; the sim proves the same logic on less.
  o.probe_bytes = sim_hooks_present() ? 1ull << 20 : 16ull << 20;
  auto s = must(device::Stream::create());
  auto host = must(device::PinnedBuffer::allocate(o.probe_bytes));
  auto dev = must(device::DeviceBuffer::allocate(2 * o.probe_bytes));
  const auto src = random_bytes(o.probe_bytes, 41);
  std::memcpy(host.data(), src.data(), src.size());
  for (const std::uint64_t size : sizes) {
    if (o.probe_bytes / size < 2) continue;  // the probe skips it too
    const auto segs = device::probe_layout(host.data(), dev.data(), o.probe_bytes, size);
    for (const device::BatchPath path : {device::BatchPath::kernel, device::BatchPath::dma_batch}) {
      INFO(size << " B segments, path " << (path == device::BatchPath::kernel ? "kernel" : "DMA batch"));
      device::set_batch_path(path);
      write_device(s, dev.data(), std::vector<std::byte>(2 * o.probe_bytes, std::byte{0}));
      require_ok(device::copy_batch(s, device::CopyKind::host_to_device, segs));
      const auto on_device = read_device(s, dev.data(), 2 * o.probe_bytes);
      for (const device::Segment& g : segs)
        REQUIRE(std::memcmp(on_device.data() + (static_cast<const std::byte*>(g.dst) - dev.data()),
                            static_cast<const std::byte*>(g.src), size) == 0);
    }
    device::set_batch_path(device::BatchPath::fastest);
    INFO(size << " B segments, the probe");
    o.segment_bytes = {size};
    o.rounds = 1;
    o.copies_per_round = 2;
    require_ok(device::measure_load_paths(o).status());
  }
}
