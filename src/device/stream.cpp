#include "device/stream.hpp"

#include "device/event.hpp"

namespace kvstrand::device {

Result<Stream> Stream::create() {
  void* h = nullptr;
  if (Status s = backend::stream_create(&h); !s.ok()) return s;
  return Stream(h);
}

Stream Stream::borrow(void* native) noexcept {
  Stream s(nullptr);
  s.borrowed_ = native;
  return s;
}

Status Stream::synchronize() { return backend::stream_synchronize(native()); }
Status Stream::query() { return backend::stream_query(native()); }
Status Stream::wait(const Event& e) { return backend::stream_wait_event(native(), e.native()); }
Status Stream::host_func(void (*fn)(void*), void* arg) {
  if (fn == nullptr) return {Errc::invalid_value, "Stream::host_func", "null function"};
  return backend::stream_host_func(native(), fn, arg);
}

}  // namespace kvstrand::device
