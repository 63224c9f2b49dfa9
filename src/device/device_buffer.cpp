#include "device/device_buffer.hpp"

namespace kvstrand::device {

Result<DeviceBuffer> DeviceBuffer::allocate(std::size_t bytes) {
  if (bytes == 0) return Status{Errc::invalid_value, "DeviceBuffer::allocate", "zero bytes"};
  void* p = nullptr;
  if (Status s = backend::device_malloc(&p, bytes); !s.ok()) return s;
  return DeviceBuffer(p, bytes);
}

Result<IpcHandle> DeviceBuffer::export_ipc() const {
  IpcHandle h;
  if (Status s = backend::ipc_export(h_.get(), &h); !s.ok()) return s;
  h.bytes = size_;
  return h;
}

}  // namespace kvstrand::device
