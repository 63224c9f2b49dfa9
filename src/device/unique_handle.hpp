// Move-only ownership of one backend handle, released by a backend call.
#pragma once

#include <utility>

#include "device/status.hpp"

namespace kvstrand::device::detail {

template <Status (*Release)(void*)>
class UniqueHandle {
 public:
  UniqueHandle() = default;
  explicit UniqueHandle(void* h) noexcept : h_(h) {}
  UniqueHandle(UniqueHandle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  UniqueHandle& operator=(UniqueHandle&& o) noexcept {
    if (this != &o) {
      reset();
      h_ = std::exchange(o.h_, nullptr);
    }
    return *this;
  }
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;
  ~UniqueHandle() { reset(); }

  void* get() const noexcept { return h_; }
  explicit operator bool() const noexcept { return h_ != nullptr; }
  // A release failure in a destructor has nowhere to go but the log.
  void reset() noexcept;

 private:
  void* h_ = nullptr;
};

void log_release_failure(const Status& s) noexcept;

template <Status (*Release)(void*)>
void UniqueHandle<Release>::reset() noexcept {
  if (h_ == nullptr) return;
  Status s = Release(std::exchange(h_, nullptr));
  if (!s.ok()) log_release_failure(s);
}

}  // namespace kvstrand::device::detail
