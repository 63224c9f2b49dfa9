// A handle to device memory that can cross a process boundary.
//
// Plain bytes: send `bytes` over any channel and rebuild the handle with
// from_bytes() in the other process, then open it with ImportedBuffer::open().
// The handle names a whole allocation; offsets into it travel separately.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

namespace kvstrand::device {

struct IpcHandle {
  static constexpr std::size_t opaque_size = 64;  // hipIpcMemHandle_t's size

  std::array<std::byte, opaque_size> opaque{};  // the backend's handle
  std::uint64_t bytes = 0;                      // size of the exported allocation

  static constexpr std::size_t wire_size = opaque_size + sizeof(std::uint64_t);
  std::array<std::byte, wire_size> to_bytes() const;
  static std::optional<IpcHandle> from_bytes(std::span<const std::byte> wire);
};

}  // namespace kvstrand::device
