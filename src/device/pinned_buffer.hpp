// Page-locked host memory: the host side of fast asynchronous copies.
#pragma once

#include <cstddef>
#include <span>

#include "device/backend.hpp"
#include "device/unique_handle.hpp"

namespace kvstrand::device {

class PinnedBuffer {
 public:
  static Result<PinnedBuffer> allocate(std::size_t bytes);

  PinnedBuffer(PinnedBuffer&&) noexcept = default;
  PinnedBuffer& operator=(PinnedBuffer&&) noexcept = default;

  std::byte* data() const noexcept { return static_cast<std::byte*>(h_.get()); }
  std::size_t size() const noexcept { return size_; }
  std::span<std::byte> span() const noexcept { return {data(), size_}; }

 private:
  PinnedBuffer(void* p, std::size_t n) : h_(p), size_(n) {}
  detail::UniqueHandle<&backend::host_free> h_;
  std::size_t size_ = 0;
};

}  // namespace kvstrand::device
