#include "demo_process.hpp"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace kvstrand::engine {

DemoProcess::DemoProcess(std::vector<std::string> args, const std::function<bool()>& ready,
                         std::chrono::seconds timeout, const std::string& hint) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (const int e = ::posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ); e != 0) {
    pid_ = -1;
    throw std::runtime_error("cannot start " + args[0] + ": " + std::strerror(e) + " (give " + hint + ")");
  }
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (ready()) return;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error(args[0] + " exited at start (status " + std::to_string(status) +
                               "); its message is above");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop();
  throw std::runtime_error(args[0] + " was not ready within " + std::to_string(timeout.count()) + " s");
}

DemoProcess::~DemoProcess() { stop(); }

void DemoProcess::kill_now() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

void DemoProcess::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  int status = 0;
  ::waitpid(pid_, &status, 0);
  pid_ = -1;
}

}  // namespace kvstrand::engine
