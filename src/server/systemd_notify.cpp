#include "server/systemd_notify.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include "common/await_codes.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>

namespace kvstrand::server {

bool notify_supervisor(const std::string& state) {
  const char* path = std::getenv("NOTIFY_SOCKET");
  if (path == nullptr || path[0] == '\0') return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::size_t n = std::strlen(path);
  if (n >= sizeof addr.sun_path || (path[0] != '/' && path[0] != '@')) {
    spdlog::debug("kvstrand-server: NOTIFY_SOCKET '{}' is not a socket path", path);
    return false;
  }
  std::memcpy(addr.sun_path, path, n);
  if (path[0] == '@') addr.sun_path[0] = '\0';  // the abstract namespace
  const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + n);
  const bool sent =
      ::sendto(fd, state.data(), state.size(), MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr), len) ==
      static_cast<ssize_t>(state.size());
  if (!sent) spdlog::debug("kvstrand-server: notifying {}: {}", path, std::strerror(errno));
  ::close(fd);
  return sent;
}

std::chrono::microseconds watchdog_interval() {
  const char* usec = std::getenv("WATCHDOG_USEC");
  if (usec == nullptr || usec[0] == '\0') return {};
  if (const char* pid = std::getenv("WATCHDOG_PID"); pid != nullptr && pid[0] != '\0') {
    char* end = nullptr;
    const long long p = std::strtoll(pid, &end, 10);
    if (*end != '\0' || p != static_cast<long long>(::getpid())) return {};  // another process's
  }
  char* end = nullptr;
  const unsigned long long us = std::strtoull(usec, &end, 10);
  if (*end != '\0' || us == 0) return {};
  return std::chrono::microseconds(us / 2);
}

boost::asio::awaitable<void> feed_watchdog(boost::asio::steady_timer& timer, std::chrono::microseconds every) {
  for (;;) {
    notify_supervisor("WATCHDOG=1");
    timer.expires_after(every);
    if (auto [ec] = co_await timer.async_wait(common::kAwait); ec) co_return;  // cancelled: stopping
  }
}

}  // namespace kvstrand::server
