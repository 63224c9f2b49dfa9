// Device memory of another process, opened from its IpcHandle.
//
// Closing (destruction) unmaps it. The owner of an ImportedBuffer must make
// sure no copy queued on it is still running before it is destroyed: await an
// event recorded after the last such copy first.
#pragma once

#include <cstddef>

#include "hip/backend.hpp"
#include "hip/ipc_handle.hpp"
#include "hip/unique_handle.hpp"

namespace kvstrand::hip {

class ImportedBuffer {
 public:
  static Result<ImportedBuffer> open(const IpcHandle& handle);

  ImportedBuffer(ImportedBuffer&&) noexcept = default;
  ImportedBuffer& operator=(ImportedBuffer&&) noexcept = default;

  std::byte* data() const noexcept { return static_cast<std::byte*>(h_.get()); }
  std::size_t size() const noexcept { return size_; }

 private:
  ImportedBuffer(void* p, std::size_t n) : h_(p), size_(n) {}
  detail::UniqueHandle<&backend::ipc_close> h_;
  std::size_t size_ = 0;
};

}  // namespace kvstrand::hip
