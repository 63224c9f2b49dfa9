// IPC export of device memory in this process, import in a real second
// process (kvstrand-ipc-peer, started with posix_spawn: not a fork that
// would inherit the mapping).
#include <cstdio>

#include "device/imported_buffer.hpp"
#include "process.hpp"
#include "support.hpp"

using namespace kvstrand;
using namespace kvstrand::test;

namespace {
std::string to_hex(const device::IpcHandle& h) {
  std::string s;
  char b[3];
  for (std::byte x : h.to_bytes()) {
    std::snprintf(b, sizeof b, "%02x", static_cast<unsigned>(x));
    s += b;
  }
  return s;
}
}  // namespace

TEST_CASE("IPC handle survives the trip through bytes", "[device][ipc]") {
  device::IpcHandle h;
  for (std::size_t i = 0; i < h.opaque.size(); ++i) h.opaque[i] = static_cast<std::byte>(i * 7 + 1);
  h.bytes = 0x1234567890ull;
  const auto wire = h.to_bytes();
  auto back = device::IpcHandle::from_bytes(wire);
  REQUIRE(back.has_value());
  REQUIRE(back->opaque == h.opaque);
  REQUIRE(back->bytes == h.bytes);
  REQUIRE_FALSE(device::IpcHandle::from_bytes(std::span(wire).first(10)).has_value());
}

TEST_CASE("device memory exported here is read and written by another process", "[device][ipc][gpu]") {
  if (!device_present()) return;
  auto s = must(device::Stream::create());
  const std::size_t n = (1 << 20) + 4096 * 3;
  auto dev = must(device::DeviceBuffer::allocate(n));
  write_device(s, dev.data(), random_bytes(n, 42));
  auto handle = must(dev.export_ipc());
  REQUIRE(handle.bytes == n);

  auto r = run_process({sibling_binary("kvstrand-ipc-peer"), "verify-and-write", to_hex(handle),
                        std::to_string(n), "42"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // What the other process wrote is what this process now reads.
  REQUIRE(read_device(s, dev.data(), n) == random_bytes(n, 43));
}

TEST_CASE("opening a handle in its own process is refused with a typed error", "[device][ipc][gpu]") {
  if (!device_present()) return;
  auto dev = must(device::DeviceBuffer::allocate(4096));
  auto handle = must(dev.export_ipc());
  auto imported = device::ImportedBuffer::open(handle);
  REQUIRE_FALSE(imported.ok());
  INFO(imported.status().describe());
  REQUIRE((imported.status().code() == device::Errc::ipc_failure || imported.status().code() == device::Errc::invalid_value));
}

TEST_CASE("a handle to freed memory or garbage fails to open in the other process", "[device][ipc][fault]") {
  if (!device_present()) return;
  device::IpcHandle stale;
  {
    auto dev = must(device::DeviceBuffer::allocate(4096));
    stale = must(dev.export_ipc());
  }  // freed
  auto r = run_process({sibling_binary("kvstrand-ipc-peer"), "open", to_hex(stale)});
  INFO(r.output);
  REQUIRE(r.exit_code == 3);
  REQUIRE(r.output.find("hipIpcOpenMemHandle") != std::string::npos);

  device::IpcHandle garbage;
  garbage.opaque.fill(std::byte{0x5a});
  garbage.bytes = 4096;
  r = run_process({sibling_binary("kvstrand-ipc-peer"), "open", to_hex(garbage)});
  INFO(r.output);
  REQUIRE(r.exit_code == 3);
}
