#include "demo_server.hpp"

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

DemoServer::~DemoServer() {
  process_.reset();  // SIGTERM: a server with --l2 writes its queue behind first
  ::unlink(socket_.c_str());
}

}  // namespace kvstrand::engine
