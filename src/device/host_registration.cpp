#include "device/host_registration.hpp"

namespace kvstrand::device {

Result<HostRegistration> HostRegistration::register_range(void* p, std::size_t bytes) {
  if (p == nullptr || bytes == 0) return Status{Errc::invalid_value, "hipHostRegister", "empty range"};
  if (Status s = backend::host_register(p, bytes); !s.ok()) return s;
  return HostRegistration(p, bytes);
}

}  // namespace kvstrand::device
