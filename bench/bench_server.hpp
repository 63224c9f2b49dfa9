// A kvstrand-server a benchmark starts beside it (../kvstrand-server from
// the benchmark, in the build and in the GPU pack), on a private socket;
// SIGTERM and reaped at the end.
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "reference_geometry.hpp"

extern char** environ;

namespace kvstrand::bench {

inline std::string self_dir() { return std::filesystem::read_symlink("/proc/self/exe").parent_path().string(); }

struct BenchServer {
  std::string socket;
  pid_t pid = -1;
  // `name`: the benchmark's, for the socket's path.
  explicit BenchServer(const std::string& name)
      : socket("/tmp/kvstrand-" + name + "-" + std::to_string(::getpid()) + ".sock") {}
  BenchServer(const BenchServer&) = delete;
  BenchServer& operator=(const BenchServer&) = delete;
  // Starts it with `flags` (after --socket and a quiet log level).
  void spawn(const std::vector<std::string>& flags) {
    std::vector<std::string> args = {self_dir() + "/../kvstrand-server", "--socket", socket, "--log-level", "warn"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) die("cannot start " + args[0]);
  }
  void kill(int sig) {
    if (pid <= 0) return;
    ::kill(pid, sig);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
  bool exited() const { return ::waitpid(pid, nullptr, WNOHANG) == pid; }
  ~BenchServer() {
    kill(SIGTERM);
    ::unlink(socket.c_str());
  }
};

}  // namespace kvstrand::bench
