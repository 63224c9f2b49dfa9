#include "hip/stream.hpp"

namespace kvstrand::hip {

Result<Stream> Stream::create() {
  void* h = nullptr;
  if (Status s = backend::stream_create(&h); !s.ok()) return s;
  return Stream(h);
}

Status Stream::synchronize() { return backend::stream_synchronize(h_.get()); }
Status Stream::query() { return backend::stream_query(h_.get()); }
Status Stream::host_func(void (*fn)(void*), void* arg) {
  if (fn == nullptr) return {Errc::invalid_value, "Stream::host_func", "null function"};
  return backend::stream_host_func(h_.get(), fn, arg);
}

}  // namespace kvstrand::hip
