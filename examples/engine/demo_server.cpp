#include "demo_server.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <vector>

extern char** environ;

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
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (const int e = ::posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ); e != 0) {
    pid_ = -1;
    throw std::runtime_error("cannot start " + binary + ": " + std::strerror(e) + " (give --server-binary)");
  }
  for (int i = 0; i < 3000; ++i) {
    if (accepts(socket_)) return;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error(binary + " exited at start (status " + std::to_string(status) +
                               "); its message is above");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop();
  throw std::runtime_error(binary + " did not accept connections on " + socket_ + " within 30 s");
}

DemoServer::~DemoServer() { stop(); }

void DemoServer::stop() {
  if (pid_ > 0) {
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  ::unlink(socket_.c_str());
}

}  // namespace kvstrand::engine
