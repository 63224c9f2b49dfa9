#include "device/device.hpp"

#include "device/backend.hpp"

namespace kvstrand::device {

const char* backend_name() noexcept { return backend::name(); }
bool backend_is_gpu() noexcept { return backend::is_gpu(); }

Result<int> device_count() {
  int n = 0;
  if (Status s = backend::device_count(&n); !s.ok()) return s;
  return n;
}

Result<std::string> device_name(int ordinal) {
  std::string name;
  if (Status s = backend::device_name(ordinal, &name); !s.ok()) return s;
  return name;
}

Status select_device(int ordinal) { return backend::set_device(ordinal); }

}  // namespace kvstrand::device
