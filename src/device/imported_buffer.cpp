#include "device/imported_buffer.hpp"

#include <cstring>

namespace kvstrand::device {

std::array<std::byte, IpcHandle::wire_size> IpcHandle::to_bytes() const {
  std::array<std::byte, wire_size> out{};
  std::memcpy(out.data(), opaque.data(), opaque_size);
  std::memcpy(out.data() + opaque_size, &bytes, sizeof bytes);
  return out;
}

std::optional<IpcHandle> IpcHandle::from_bytes(std::span<const std::byte> wire) {
  if (wire.size() != wire_size) return std::nullopt;
  IpcHandle h;
  std::memcpy(h.opaque.data(), wire.data(), opaque_size);
  std::memcpy(&h.bytes, wire.data() + opaque_size, sizeof h.bytes);
  return h;
}

Result<IpcRange> export_ipc_range(const void* ptr) {
  if (ptr == nullptr) return Status{Errc::invalid_value, "export_ipc_range", "null pointer"};
  IpcRange r;
  if (Status s = backend::ipc_export_range(ptr, &r.handle, &r.offset); !s.ok()) return s;
  return r;
}

Result<ImportedBuffer> ImportedBuffer::open(const IpcHandle& handle) {
  if (handle.bytes == 0) return Status{Errc::invalid_value, "ImportedBuffer::open", "handle of zero bytes"};
  void* p = nullptr;
  if (Status s = backend::ipc_open(handle, &p); !s.ok()) return s;
  return ImportedBuffer(p, handle.bytes);
}

}  // namespace kvstrand::device
