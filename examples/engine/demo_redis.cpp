#include "demo_redis.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

extern char** environ;

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
  std::vector<std::string> args = {binary, "--port", std::to_string(port_), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--maxmemory", std::to_string(max_bytes),
                                   "--maxmemory-policy", "allkeys-lru", "--logfile", "/dev/null"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (const int e = ::posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ); e != 0) {
    pid_ = -1;
    throw std::runtime_error("cannot start " + binary + ": " + std::strerror(e) + " (give --l2 or --redis-binary)");
  }
  for (int i = 0; i < 1000; ++i) {
    if (pongs(port_)) return;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error(binary + " exited at start (status " + std::to_string(status) + ")");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  throw std::runtime_error(binary + " does not answer PING on port " + std::to_string(port_) + " within 10 s");
}

DemoRedis::~DemoRedis() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
  }
}

}  // namespace kvstrand::engine
