#include "device/pinned_buffer.hpp"

namespace kvstrand::device {

Result<PinnedBuffer> PinnedBuffer::allocate(std::size_t bytes) {
  if (bytes == 0) return Status{Errc::invalid_value, "PinnedBuffer::allocate", "zero bytes"};
  void* p = nullptr;
  if (Status s = backend::host_malloc(&p, bytes); !s.ok()) return s;
  return PinnedBuffer(p, bytes);
}

}  // namespace kvstrand::device
