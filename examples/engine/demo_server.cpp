#include "demo_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <vector>

namespace kvstrand::engine {

namespace {

bool accepts(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

int& next_id() {
  static int n = 0;
  return n;
}

}  // namespace

std::string DemoServer::default_binary() {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "../../kvstrand-server").string();
}

DemoServer::DemoServer(const std::string& binary, std::uint64_t tier_bytes, std::uint32_t chunk_tokens,
                       const std::vector<std::string>& extra)
    : socket_("/tmp/kvstrand-demo-" + std::to_string(::getpid()) + "-" + std::to_string(next_id()++) + ".sock") {
  ::unlink(socket_.c_str());
  std::vector<std::string> args = {binary,           "--socket",       socket_, "--tier-bytes",
                                   std::to_string(tier_bytes), "--chunk-tokens", std::to_string(chunk_tokens),
                                   "--log-level",    "warn"};
  args.insert(args.end(), extra.begin(), extra.end());
  args_ = std::move(args);
  start();
}

void DemoServer::start() {
  process_.emplace(args_, [this] { return accepts(socket_); }, std::chrono::seconds(30), "--server-binary");
}

double DemoServer::kill_and_restart() {
  process_->kill_now();
  const auto t0 = std::chrono::steady_clock::now();
  start();  // the killed server's socket file is still there: the new one replaces it
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::uint16_t DemoServer::serve_metrics() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    return 0;
  }
  ::close(fd);  // free again for the server (a race with another binder: then no figures, nothing else)
  return ntohs(a.sin_port);
}

double DemoServer::metric(std::uint16_t port, const std::string& name) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string body;
  if (fd >= 0 && ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) body.append(buf, static_cast<std::size_t>(n));
    }
  }
  if (fd >= 0) ::close(fd);
  const auto at = body.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(body.substr(at + name.size() + 2));
}

DemoServer::~DemoServer() {
  process_.reset();  // SIGTERM: a server with --l2 writes its queue behind first
  ::unlink(socket_.c_str());
}

}  // namespace kvstrand::engine
