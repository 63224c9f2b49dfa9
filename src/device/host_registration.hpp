// Host memory this process did not allocate (a mapping of the node tier's
// shared arena) pinned for the device: hipHostRegister (portable, mapped),
// so copies to and from it run at the DMA engines' speed and the
// gather/scatter kernel can address it.
//
// Registering takes tens of milliseconds a GiB: call register_range() off
// the reactor strand. The range must stay mapped until the registration is
// gone.
#pragma once

#include <cstddef>

#include "device/backend.hpp"
#include "device/unique_handle.hpp"

namespace kvstrand::device {

class HostRegistration {
 public:
  static Result<HostRegistration> register_range(void* p, std::size_t bytes);

  HostRegistration(HostRegistration&&) noexcept = default;
  HostRegistration& operator=(HostRegistration&&) noexcept = default;

  std::byte* data() const noexcept { return static_cast<std::byte*>(h_.get()); }
  std::size_t size() const noexcept { return size_; }

 private:
  HostRegistration(void* p, std::size_t n) : h_(p), size_(n) {}
  detail::UniqueHandle<&backend::host_unregister> h_;
  std::size_t size_ = 0;
};

}  // namespace kvstrand::device
