// Device memory of another process, opened from its IpcHandle.
//
// Closing (destruction) unmaps it. The owner of an ImportedBuffer must make
// sure no copy queued on it is still running before it is destroyed: await an
// event recorded after the last such copy first.
#pragma once

#include <cstddef>

#include "device/backend.hpp"
#include "device/ipc_handle.hpp"
#include "device/unique_handle.hpp"

namespace kvstrand::device {

// The IPC handle of the device allocation that contains `ptr`, and where ptr
// lies in it: for exporting memory the caller knows only by pointer (a plane
// base inside a larger pool, say). The importer adds `offset` to the base.
struct IpcRange {
  IpcHandle handle;
  std::uint64_t offset = 0;
};
Result<IpcRange> export_ipc_range(const void* ptr);

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

}  // namespace kvstrand::device
