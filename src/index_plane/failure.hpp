// The one shape of a failure with its words, on the engine side: a code the
// caller can act on, and why (the server's own words, the socket path, the
// OS error), passed on to the engine once. An empty code is no failure.
#pragma once

#include <string>
#include <system_error>

namespace kvstrand::index_plane {

struct Failure {
  std::error_code ec;
  std::string why;
  explicit operator bool() const noexcept { return static_cast<bool>(ec); }
};

}  // namespace kvstrand::index_plane
