#include "device/unique_handle.hpp"

#include <spdlog/spdlog.h>

namespace kvstrand::device::detail {

void log_release_failure(const Status& s) noexcept {
  try {
    spdlog::error("kvstrand: releasing a device handle failed: {}", s.describe());
  } catch (...) {
    // Logging must not turn a failed release into a terminate.
  }
}

}  // namespace kvstrand::device::detail
