// The second process of test_ipc: opens device memory exported by the test.
//
//   kvstrand-ipc-peer verify-and-write HANDLE_HEX BYTES SEED
//     opens the handle, checks the memory holds random_bytes(BYTES, SEED),
//     then writes random_bytes(BYTES, SEED + 1) into it. Exit 0 on success.
//   kvstrand-ipc-peer open HANDLE_HEX
//     only opens it; prints the typed error and exits 3 if that fails.
#include <cstdio>
#include <cstring>
#include <string>

#include "device/copy.hpp"
#include "device/device.hpp"
#include "device/event.hpp"
#include "device/imported_buffer.hpp"
#include "device/pinned_buffer.hpp"
#include "device/stream.hpp"
#include "random_bytes.hpp"

using namespace kvstrand;

namespace {

int fail(const char* what, const device::Status& s) {
  std::printf("%s: %s [%s]\n", what, s.describe().c_str(), s.code().message().c_str());
  return 3;
}

bool parse_handle(const char* hex, device::IpcHandle* out) {
  std::vector<std::byte> wire;
  const std::size_t n = std::strlen(hex);
  if (n != 2 * device::IpcHandle::wire_size) return false;
  for (std::size_t i = 0; i < n; i += 2) {
    unsigned v = 0;
    if (std::sscanf(hex + i, "%2x", &v) != 1) return false;
    wire.push_back(static_cast<std::byte>(v));
  }
  auto h = device::IpcHandle::from_bytes(wire);
  if (!h) return false;
  *out = *h;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s verify-and-write|open HANDLE_HEX [BYTES SEED]\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  device::IpcHandle handle;
  if (!parse_handle(argv[2], &handle)) {
    std::fprintf(stderr, "bad handle\n");
    return 2;
  }
  if (device::Status s = device::select_device(0); !s.ok()) return fail("select_device", s);
  auto imported = device::ImportedBuffer::open(handle);
  if (!imported.ok()) return fail("open", imported.status());
  if (mode == "open") return 0;
  if (mode != "verify-and-write" || argc != 5) return 2;

  const std::size_t bytes = std::stoull(argv[3]);
  const std::uint64_t seed = std::stoull(argv[4]);
  auto stream = device::Stream::create();
  auto host = device::PinnedBuffer::allocate(bytes);
  if (!stream.ok() || !host.ok()) return fail("setup", stream.ok() ? host.status() : stream.status());
  if (auto s = device::copy_d2h(*stream, host->data(), imported->data(), bytes); !s.ok()) return fail("d2h", s);
  if (auto s = stream->synchronize(); !s.ok()) return fail("sync", s);
  const auto expected = test::random_bytes(bytes, seed);
  if (std::memcmp(host->data(), expected.data(), bytes) != 0) {
    std::printf("mismatch: imported memory does not hold what the exporter wrote\n");
    return 4;
  }
  const auto reply = test::random_bytes(bytes, seed + 1);
  std::memcpy(host->data(), reply.data(), bytes);
  if (auto s = device::copy_h2d(*stream, imported->data(), host->data(), bytes); !s.ok()) return fail("h2d", s);
  if (auto s = stream->synchronize(); !s.ok()) return fail("sync", s);
  std::printf("ok\n");
  return 0;
}
