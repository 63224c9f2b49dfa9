// Load latency of the reference geometry through the embedded tier, against
// one contiguous copy of the same bytes measured in the same run.
//
// Geometry: 5 planes, 739,840 B per block across them, 16-token blocks,
// 256-token chunks, a pool of 4000 blocks (--pool-blocks to shrink it), and
// a 1 MiB checkpoint image. The load is the seed's: 28 blocks (tokens
// [64, 512): two chunk objects, the first entered mid-chunk) into scattered
// destination blocks, with the image at 512. Latency: from load() to the
// completion being visible to finished() (polled in a tight loop). Baseline:
// one H2D copy of the same byte count from pinned memory, awaited by event.
// Also prints save latency of the same two chunks. Last line:
//   load latency ratio to one contiguous copy: X
//
// usage: bench_transfer [--iterations N] [--pool-blocks N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hip/copy.hpp"
#include "hip/device.hpp"
#include "hip/device_buffer.hpp"
#include "hip/event.hpp"
#include "hip/pinned_buffer.hpp"
#include "hip/stream.hpp"
#include "kv/chunk_keys.hpp"
#include "kv/namespace_id.hpp"
#include "reactor/connector.hpp"
#include "percentile.hpp"

using namespace kvstrand;
using kvstrand::bench::pct;
using Clock = std::chrono::steady_clock;

namespace {

template <class T>
T must(hip::Result<T> r, const char* what) {
  if (!r.ok()) {
    std::fprintf(stderr, "bench_transfer: %s: %s\n", what, r.status().describe().c_str());
    std::exit(1);
  }
  return std::move(r).value();
}

reactor::Finished wait_one(reactor::Connector& c) {
  for (;;) {
    auto f = c.finished();
    if (!f.saves.empty() || !f.loads.empty()) return f;
  }
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 200;
  std::uint32_t pool_blocks = 4000;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--iterations") iterations = std::max(10, std::atoi(argv[i + 1]));
    else if (a == "--pool-blocks") pool_blocks = std::max(64, std::atoi(argv[i + 1]));
  }
  if (auto n = hip::device_count(); !n.ok() || *n == 0) {
    std::fprintf(stderr, "bench_transfer: no %s device\n", hip::backend_name());
    return 1;
  }
  (void)hip::select_device(0);

  kv::Layout l;
  l.model_id = "bench";
  l.layout_name = "reference";
  for (int p = 0; p < 5; ++p) l.planes.push_back({"p" + std::to_string(p), 739'840 / 5});
  l.checkpoint = {"ring", 1 << 20, 256};
  l.dtype = "fp8";
  const kv::Digest ns = kv::namespace_of(l);
  std::vector<std::uint32_t> toks(512);
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint32_t>(i * 7 + 3);
  const auto keys = kv::chunk_keys(l, ns, toks);

  std::printf("bench_transfer: backend %s, pool %u blocks x 739840 B, load of 28 blocks + 1 MiB image\n",
              hip::backend_name(), pool_blocks);
  std::fflush(stdout);
  std::vector<hip::DeviceBuffer> planes;
  auto stream = must(hip::Stream::create(), "stream");
  {
    auto zero = must(hip::PinnedBuffer::allocate(static_cast<std::size_t>(pool_blocks) * (739'840 / 5)), "pinned");
    std::memset(zero.data(), 0x5a, zero.size());
    for (int p = 0; p < 5; ++p) {
      planes.push_back(must(hip::DeviceBuffer::allocate(zero.size()), "plane"));
      (void)hip::copy_h2d(stream, planes.back().data(), zero.data(), zero.size());  // touch every page
    }
    (void)stream.synchronize();
  }
  auto state = must(hip::DeviceBuffer::allocate(4 << 20), "state");

  reactor::ConnectorOptions opts;
  opts.tier_bytes = 64ull << 20;
  reactor::Connector conn(opts);
  reactor::Registration reg;
  reg.layout = l;
  for (auto& p : planes) reg.planes.push_back({p.data(), pool_blocks});
  reg.state = {state.data(), 4};
  conn.register_layout(reg);

  std::mt19937 rng(1);
  auto scattered = [&](std::size_t n) {
    std::vector<kv::BlockId> v;
    while (v.size() < n) {
      const kv::BlockId b = rng() % pool_blocks;
      if (std::find(v.begin(), v.end(), b) == v.end()) v.push_back(b);
    }
    return v;
  };

  std::vector<double> save_us, load_us, copy_us;
  const std::size_t load_bytes = 28ull * 739'840 + (1 << 20);
  auto src = must(hip::PinnedBuffer::allocate(load_bytes), "pinned");
  std::memset(src.data(), 0x33, src.size());
  auto dst = must(hip::DeviceBuffer::allocate(load_bytes), "device");
  auto ev = must(hip::Event::create(), "event");

  for (int i = 0; i < iterations; ++i) {
    // Save both chunks once (32 blocks, images at 256 and 512); every load
    // then reads those two objects.
    if (i == 0) {
      kv::TransferSpec s;
      s.request = "save";
      s.tokens = {0, 512};
      s.keys = keys;
      s.blocks = scattered(32);
      s.with_state = true;
      s.state_slots = {0, 1};
      const auto t0 = Clock::now();
      conn.save(s);
      auto f = wait_one(conn);
      save_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      if (!f.saves[0].ok) {
        std::fprintf(stderr, "bench_transfer: save failed: %s\n", f.saves[0].reason.c_str());
        return 1;
      }
    }
    kv::TransferSpec s;
    s.request = "load";
    s.tokens = {64, 512};
    s.keys = keys;
    s.blocks = scattered(28);
    s.with_state = true;
    s.state_slots = {2};
    const auto t0 = Clock::now();
    conn.load(std::move(s));
    auto f = wait_one(conn);
    load_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (!f.loads[0].ok) {
      std::fprintf(stderr, "bench_transfer: load failed: %s\n", f.loads[0].reason.c_str());
      return 1;
    }
    const auto t1 = Clock::now();
    (void)hip::copy_h2d(stream, dst.data(), src.data(), load_bytes);
    (void)ev.record(stream);
    (void)ev.synchronize();
    copy_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t1).count());
  }
  conn.close();
  const double gb = static_cast<double>(load_bytes) / 1e3;  // bytes per us = MB/s; /1e3 -> GB/s
  std::printf("  save of 2 chunks (32 blocks + 2 images) us: %.0f (first, cold)\n", save_us[0]);
  std::printf("  one contiguous copy of %.1f MiB us: p50 %.0f p99 %.0f (%.1f GB/s)\n",
              static_cast<double>(load_bytes) / (1 << 20), pct(copy_us, 0.5), pct(copy_us, 0.99),
              gb / pct(copy_us, 0.5));
  std::printf("  load via LocalTier us: p50 %.0f p99 %.0f (%.1f GB/s)\n", pct(load_us, 0.5), pct(load_us, 0.99),
              gb / pct(load_us, 0.5));
  std::printf("load latency ratio to one contiguous copy: %.2f\n", pct(load_us, 0.5) / pct(copy_us, 0.5));
  return 0;
}
