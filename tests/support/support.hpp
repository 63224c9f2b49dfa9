// Helpers shared by the test files: random data, device round trips, and the
// [gpu] skip rule.
#pragma once

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "random_bytes.hpp"
#include "device/copy.hpp"
#include "device/device.hpp"
#include "device/device_buffer.hpp"
#include "device/event.hpp"
#include "device/pinned_buffer.hpp"
#include "device/sim_hooks.hpp"
#include "device/stream.hpp"

namespace kvstrand::test {

// True when a device of this build's backend is present. A GPU build on a
// machine without a GPU returns false after saying so, and the calling test
// returns: [gpu] cases skip with a clear message rather than fail.
inline bool device_present() {
  auto n = device::device_count();
  REQUIRE(n.ok());
  if (*n > 0) {
    REQUIRE(device::select_device(0).ok());
    return true;
  }
  WARN("skipped: no device for the " << device::backend_name() << " backend on this machine");
  return false;
}

// The sim hooks exist only on the sim backend.
inline bool sim_hooks_present() {
  if (device::sim::available()) return true;
  WARN("skipped: needs the sim backend's injection hooks (this build: " << device::backend_name() << ")");
  return false;
}

template <class T>
T must(device::Result<T> r) {
  INFO((r.ok() ? std::string("ok") : r.status().describe()));
  REQUIRE(r.ok());
  return std::move(r).value();
}

inline void require_ok(const device::Status& s) {
  INFO(s.describe());
  REQUIRE(s.ok());
}

// Reads `n` bytes of device memory back through pinned memory.
inline std::vector<std::byte> read_device(device::Stream& s, const void* dev, std::size_t n) {
  auto host = must(device::PinnedBuffer::allocate(n));
  require_ok(device::copy_d2h(s, host.data(), dev, n));
  require_ok(s.synchronize());
  return {host.data(), host.data() + n};
}

inline void write_device(device::Stream& s, void* dev, const std::vector<std::byte>& bytes) {
  auto host = must(device::PinnedBuffer::allocate(bytes.size()));
  std::memcpy(host.data(), bytes.data(), bytes.size());
  require_ok(device::copy_h2d(s, dev, host.data(), bytes.size()));
  require_ok(s.synchronize());
}

}  // namespace kvstrand::test
