#include "demo_redis.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

namespace kvstrand::engine {

namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Sends PING and reads "+PONG"; start-up only, so plain blocking calls.
bool pongs(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::send(fd, "PING\r\n", 6, 0) == 6;
  char buf[8] = {};
  ok = ok && ::recv(fd, buf, 5, MSG_WAITALL) == 5 && std::memcmp(buf, "+PONG", 5) == 0;
  ::close(fd);
  return ok;
}

}  // namespace

DemoRedis::DemoRedis(const std::string& binary, std::uint64_t max_bytes) : port_(free_port()) {
  process_.emplace(std::vector<std::string>{binary, "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save",
                                            "", "--appendonly", "no", "--maxmemory", std::to_string(max_bytes),
                                            "--maxmemory-policy", "allkeys-lru", "--logfile", "/dev/null"},
                   [this] { return pongs(port_); }, std::chrono::seconds(10), "--l2 or --redis-binary");
}

}  // namespace kvstrand::engine
