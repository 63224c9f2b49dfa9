// The reference geometry the transfer benchmarks share: the seed's 5 planes
// of 739,840 B per block, 16-token blocks, 256-token chunks, a 1 MiB
// checkpoint image; a device block pool an engine would own; and the spec of
// a 512-token prompt's save.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "device/copy.hpp"
#include "device/device_buffer.hpp"
#include "device/pinned_buffer.hpp"
#include "device/stream.hpp"
#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/namespace_id.hpp>
#include "connector/connector.hpp"
#include "connector/connector.hpp"
#include <chrono>
#include <memory>
#include <thread>

namespace kvstrand::bench {

constexpr std::uint64_t kBlockBytes = 739'840;  // across the 5 planes
constexpr std::uint64_t kImageBytes = 1 << 20;

[[noreturn]] inline void die(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what.c_str());
  std::exit(1);
}

template <class T>
T must(device::Result<T> r, const char* what) {
  if (!r.ok()) die(std::string(what) + ": " + r.status().describe());
  return std::move(r).value();
}

inline kv::Layout reference_layout() {
  kv::Layout l;
  l.model_id = "bench";
  l.layout_name = "reference";
  for (int p = 0; p < 5; ++p) l.planes.push_back({"p" + std::to_string(p), kBlockBytes / 5});
  l.checkpoint = {"ring", kImageBytes, 256};
  l.dtype = "fp8";
  return l;
}

// Keys of a 512-token prompt numbered `prompt` (its first two tokens).
inline std::vector<kv::ChunkKey> prompt_keys(const kv::Layout& l, std::uint64_t prompt) {
  std::vector<std::uint32_t> toks(512);
  for (std::size_t i = 0; i < toks.size(); ++i) toks[i] = static_cast<std::uint32_t>(i * 7 + 3);
  toks[0] = static_cast<std::uint32_t>(prompt);
  toks[1] = static_cast<std::uint32_t>(prompt >> 32);
  return kv::chunk_keys(l, kv::namespace_of(l), toks);
}

// The device side of an engine: the planes of a block pool and state slots.
struct Pool {
  std::uint32_t blocks;
  std::vector<device::DeviceBuffer> planes;
  device::DeviceBuffer state = must(device::DeviceBuffer::allocate(4 * kImageBytes), "state");

  explicit Pool(std::uint32_t n) : blocks(n) {
    auto stream = must(device::Stream::create(), "stream");
    auto fill = must(device::PinnedBuffer::allocate(static_cast<std::size_t>(n) * (kBlockBytes / 5)), "pinned");
    std::memset(fill.data(), 0x5a, fill.size());
    for (int p = 0; p < 5; ++p) {
      planes.push_back(must(device::DeviceBuffer::allocate(fill.size()), "plane"));
      (void)device::copy_h2d(stream, planes.back().data(), fill.data(), fill.size());  // touch every page
    }
    (void)stream.synchronize();
  }
  kvstrand::Registration registration(const kv::Layout& l) {
    kvstrand::Registration reg;
    reg.layout = l;
    for (auto& p : planes) reg.planes.push_back({p.data(), blocks});
    reg.state = {state.data(), 4};
    return reg;
  }
};

inline kv::TransferSpec save_spec(const kv::Layout& l, std::uint64_t prompt, std::vector<kv::BlockId> blocks) {
  kv::TransferSpec s;
  s.request = "save-" + std::to_string(prompt);
  s.tokens = {0, 512};
  s.keys = prompt_keys(l, prompt);
  s.blocks = std::move(blocks);
  s.with_state = true;
  s.state_slots = {0, 1};
  return s;
}

// A Connector over the node tier.
struct NodeClient {
  std::unique_ptr<connector::Connector> conn;
  NodeClient(const std::string& socket, Pool& pool, const kv::Layout& l,
             std::chrono::microseconds idle_spin = connector::ConnectorOptions{}.reactor_idle_spin,
             std::string load_path = connector::ConnectorOptions{}.load_path) {
    connector::ConnectorOptions o;
    o.reactor_idle_spin = idle_spin;
    o.load_path = std::move(load_path);  // process-wide: a Connector's choice is every one's after it
    o.server_socket = socket;
    o.server_request_timeout = std::chrono::seconds(10);
    conn = std::make_unique<connector::Connector>(o);
    conn->register_layout(pool.registration(l));
  }
  // Seconds until the whole arena is pinned for this process's device (a
  // copy needs its slab pinned; the tier pins in the background).
  double wait_pinned(std::chrono::seconds limit) {
    using Clock = std::chrono::steady_clock;
    const auto t0 = Clock::now();
    for (;;) {
      const auto link = conn->arena_mappings();
      const std::uint64_t pinned = link.pinned_bytes, total = link.arena_bytes;
      if (total > 0 && pinned == total) return std::chrono::duration<double>(Clock::now() - t0).count();
      if (Clock::now() - t0 > limit) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
};

}  // namespace kvstrand::bench
