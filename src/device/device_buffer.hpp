// One allocation of device memory.
//
// Host code must not dereference data(): move bytes with the copy functions.
// (On the sim backend it happens to be host-addressable shared memory; tests
// do not rely on that, so the same tests run on a GPU.)
#pragma once

#include <cstddef>

#include "device/backend.hpp"
#include "device/ipc_handle.hpp"
#include "device/unique_handle.hpp"

namespace kvstrand::device {

class DeviceBuffer {
 public:
  static Result<DeviceBuffer> allocate(std::size_t bytes);

  DeviceBuffer(DeviceBuffer&&) noexcept = default;
  DeviceBuffer& operator=(DeviceBuffer&&) noexcept = default;

  std::byte* data() const noexcept { return static_cast<std::byte*>(h_.get()); }
  std::size_t size() const noexcept { return size_; }

  // A handle another process opens with ImportedBuffer::open(). The buffer
  // must outlive every importer's use of it.
  Result<IpcHandle> export_ipc() const;

 private:
  DeviceBuffer(void* p, std::size_t n) : h_(p), size_(n) {}
  detail::UniqueHandle<&backend::device_free> h_;
  std::size_t size_ = 0;
};

}  // namespace kvstrand::device
