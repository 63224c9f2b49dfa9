#include "device/status.hpp"

namespace kvstrand::device {
namespace {

class DeviceCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "kvstrand.device"; }
  std::string message(int ev) const override {
    switch (static_cast<Errc>(ev)) {
      case Errc::success: return "success";
      case Errc::invalid_value: return "invalid value";
      case Errc::out_of_memory: return "out of memory";
      case Errc::not_ready: return "not ready";
      case Errc::no_device: return "no device present";
      case Errc::launch_failure: return "operation failed on the stream";
      case Errc::ipc_failure: return "IPC handle export or import failed";
      case Errc::injected_fault: return "fault injected by a sim test hook";
      case Errc::wrong_executor: return "used from a thread that does not own it";
      case Errc::not_supported: return "not supported by this backend";
      case Errc::backend_error: return "backend error";
    }
    return "unknown device error";
  }
};

}  // namespace

const std::error_category& device_category() noexcept {
  static const DeviceCategory cat;
  return cat;
}

std::error_code make_error_code(Errc e) noexcept { return {static_cast<int>(e), device_category()}; }

std::string Status::describe() const {
  if (ok()) return "success";
  std::string s = call_.empty() ? std::string("device runtime") : call_;
  s += ": ";
  s += code_.message();
  if (!message_.empty()) {
    s += " (backend: ";
    s += message_;
    s += ")";
  }
  return s;
}

}  // namespace kvstrand::device
