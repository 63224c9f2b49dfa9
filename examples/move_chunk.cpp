// The smallest embedding of kvstrand's device runtime and polled awaitable:
// save one KV chunk of scattered blocks to a pinned host "tier object", evict
// it from device memory, load it back into other block ids, verify it.
//
// Every copy is a batched segment copy on the reactor's stream; every wait is
// `co_await poller.ready(event)` on the reactor strand, with events from the
// EventPool. The main thread plays the engine: it only posts and waits.
//
// usage: kvstrand-move-chunk [--rounds N]
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_future.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "device/copy.hpp"
#include "device/device.hpp"
#include "device/device_buffer.hpp"
#include "device/event_pool.hpp"
#include "device/pinned_buffer.hpp"
#include "device/stream.hpp"
#include "reactor/poller.hpp"

using namespace kvstrand;
namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

// The reference geometry (../docs/PERFORMANCE.md): 5 planes, 739,840 B per
// block across them; one 256-token chunk of 16-token blocks is 16 blocks.
constexpr int kPlanes = 5;
constexpr std::size_t kPlaneBlockBytes = 739'840 / kPlanes;
constexpr int kPoolBlocks = 64;
constexpr int kChunkBlocks = 16;

[[noreturn]] void die(const std::string& what, const device::Status& s) {
  std::fprintf(stderr, "kvstrand-move-chunk: %s: %s\n", what.c_str(), s.describe().c_str());
  std::exit(1);
}
template <class T>
T must(device::Result<T> r, const char* what) {
  if (!r.ok()) die(what, r.status());
  return std::move(r).value();
}
void must(const device::Status& s, const char* what) {
  if (!s.ok()) die(what, s);
}

std::vector<int> pick_blocks(std::mt19937& rng) {
  std::vector<int> ids(kPoolBlocks);
  for (int i = 0; i < kPoolBlocks; ++i) ids[i] = i;
  std::shuffle(ids.begin(), ids.end(), rng);
  ids.resize(kChunkBlocks);
  return ids;
}

std::string list(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

double ms_since(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

}  // namespace

int main(int argc, char** argv) {
  int rounds = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--rounds N]\n", argv[0]);
      return 2;
    }
  }
  const int devices = must(device::device_count(), "device_count");
  if (devices == 0) {
    std::fprintf(stderr, "kvstrand-move-chunk: no %s device on this machine; build with -DKVSTRAND_GPU=sim\n",
                 device::backend_name());
    return 1;
  }
  must(device::select_device(0), "select_device");
  std::printf("kvstrand move-chunk demo: backend %s, device \"%s\"\n", device::backend_name(),
              must(device::device_name(0), "device_name").c_str());
  const std::size_t chunk_bytes = kPlanes * kChunkBlocks * kPlaneBlockBytes;
  std::printf("  geometry: %d planes x %zu B per block, pool of %d blocks, chunk of %d blocks = %.2f MiB\n", kPlanes,
              kPlaneBlockBytes, kPoolBlocks, kChunkBlocks, static_cast<double>(chunk_bytes) / (1 << 20));

  // Engine side: the KV pool, one device allocation per plane, random KV.
  auto stream = must(device::Stream::create(), "Stream::create");
  std::vector<device::DeviceBuffer> planes;
  auto staging = must(device::PinnedBuffer::allocate(kPoolBlocks * kPlaneBlockBytes), "PinnedBuffer::allocate");
  std::mt19937_64 fill(7);
  auto randomize = [&](device::DeviceBuffer& plane) {
    for (std::size_t i = 0; i + 8 <= staging.size(); i += 8) {
      const std::uint64_t x = fill();
      std::memcpy(staging.data() + i, &x, 8);
    }
    must(device::copy_h2d(stream, plane.data(), staging.data(), plane.size()), "copy_h2d");
    must(stream.synchronize(), "synchronize");
  };
  for (int p = 0; p < kPlanes; ++p) {
    planes.push_back(must(device::DeviceBuffer::allocate(kPoolBlocks * kPlaneBlockBytes), "DeviceBuffer::allocate"));
    randomize(planes.back());
  }
  auto tier_object = must(device::PinnedBuffer::allocate(chunk_bytes), "PinnedBuffer::allocate");
  auto expected = must(device::PinnedBuffer::allocate(chunk_bytes), "PinnedBuffer::allocate");

  // Reactor side: one thread, one strand, its poller and event pool.
  asio::io_context ctx;
  auto work = asio::make_work_guard(ctx);
  common::Strand strand = asio::make_strand(ctx);
  reactor::Poller poller(strand);
  std::optional<device::EventPool> pool;  // created and destroyed on the strand
  std::thread reactor_thread([&] { ctx.run(); });

  // One transfer: a batched copy on the reactor's stream, then an awaited event.
  auto transfer = [&](device::CopyKind kind, std::vector<device::Segment> segs) -> asio::awaitable<double> {
    const auto t0 = Clock::now();
    must(device::copy_batch(stream, kind, segs), "copy_batch");
    auto ev = must(pool->acquire(), "EventPool::acquire");
    must(ev.record(stream), "Event::record");
    std::error_code ec = co_await poller.ready(ev.event());
    if (ec) die("transfer", device::Status(device::Errc::launch_failure, "poller.ready", ec.message()));
    co_return ms_since(t0);
  };
  auto on_strand = [&](auto make) { return asio::co_spawn(strand, make(), asio::use_future).get(); };
  on_strand([&]() -> asio::awaitable<void> {
    pool.emplace();
    co_return;
  });

  std::mt19937 rng(11);
  std::size_t verified = 0;
  for (int round = 1; round <= rounds; ++round) {
    const auto from = pick_blocks(rng);
    const auto to = pick_blocks(rng);
    std::vector<device::Segment> save, load, reference;
    std::size_t off = 0;
    for (int p = 0; p < kPlanes; ++p) {
      for (int b = 0; b < kChunkBlocks; ++b, off += kPlaneBlockBytes) {
        std::byte* plane = planes[p].data();
        save.push_back({plane + from[b] * kPlaneBlockBytes, tier_object.data() + off, kPlaneBlockBytes});
        reference.push_back({plane + from[b] * kPlaneBlockBytes, expected.data() + off, kPlaneBlockBytes});
        load.push_back({tier_object.data() + off, plane + to[b] * kPlaneBlockBytes, kPlaneBlockBytes});
      }
    }
    std::printf("  round %d\n", round);
    // What the chunk holds now, for the final comparison.
    must(device::copy_batch(stream, device::CopyKind::device_to_host, reference), "copy_batch");
    must(stream.synchronize(), "synchronize");

    const double save_ms = on_strand([&] { return transfer(device::CopyKind::device_to_host, save); });
    std::printf("    save  blocks [%s] of %d planes -> tier object: %zu segments, %.2f ms (%.1f GB/s)\n",
                list(from).c_str(), kPlanes, save.size(), save_ms, static_cast<double>(chunk_bytes) / save_ms / 1e6);
    for (auto& plane : planes) randomize(plane);
    std::printf("    evict: overwrote every plane of the pool with other data\n");
    const double load_ms = on_strand([&] { return transfer(device::CopyKind::host_to_device, load); });
    std::printf("    load  tier object -> blocks [%s]: %.2f ms (%.1f GB/s)\n", list(to).c_str(), load_ms,
                static_cast<double>(chunk_bytes) / load_ms / 1e6);

    // Read the destination blocks back and compare with what was saved.
    std::vector<device::Segment> check;
    for (auto& s : load) check.push_back({s.dst, const_cast<void*>(s.src), s.bytes});
    must(device::copy_batch(stream, device::CopyKind::device_to_host, check), "copy_batch");
    must(stream.synchronize(), "synchronize");
    if (std::memcmp(tier_object.data(), expected.data(), chunk_bytes) != 0) {
      std::fprintf(stderr, "kvstrand-move-chunk: MISMATCH: the loaded blocks differ from the saved ones\n");
      return 1;
    }
    verified += chunk_bytes;
    std::printf("    verify: %.2f MiB identical to what was saved, byte for byte\n",
                static_cast<double>(chunk_bytes) / (1 << 20));
  }

  const auto stats = on_strand([&]() -> asio::awaitable<std::pair<reactor::PollerStats, device::EventPool::Stats>> {
    auto result = std::make_pair(poller.stats(), pool->stats());
    pool.reset();
    co_return result;
  });
  work.reset();
  reactor_thread.join();
  std::printf("  reactor: %llu awaited events, poller ticks %llu (spin %llu, timer %llu); events created %llu, reused %llu\n",
              static_cast<unsigned long long>(stats.first.completed), static_cast<unsigned long long>(stats.first.ticks),
              static_cast<unsigned long long>(stats.first.spin_ticks),
              static_cast<unsigned long long>(stats.first.timer_ticks),
              static_cast<unsigned long long>(stats.second.created), static_cast<unsigned long long>(stats.second.reused));
  std::printf("moved %d chunks out and back, %.2f MiB verified, 0 mismatches\n", rounds,
              static_cast<double>(verified) / (1 << 20));
  return 0;
}
