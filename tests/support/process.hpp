// Helper processes for the tests: spawned with their output on a pipe, read
// with a timeout, signalled, and waited for.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <string>
#include <vector>

extern char** environ;

namespace kvstrand::test {

struct ProcessResult {
  int exit_code = -1;  // -1 when it did not exit normally
  std::string output;  // stdout and stderr together
};

// The scheduler state of `pid` ('R', 'S', 'T', 'Z', ...), or 0 when it is gone.
inline char process_state(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return 0;
  char buf[512] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  // "pid (comm) S ...": the state follows the last ')' (comm may hold spaces).
  const char* close = nullptr;
  for (std::size_t i = 0; i < n; ++i)
    if (buf[i] == ')') close = buf + i;
  return close && close[1] == ' ' ? close[2] : 0;
}

// CPU time `pid` has used, user and system, in seconds (-1 when it is gone).
inline double cpu_seconds(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
  if (f == nullptr) return -1;
  char buf[1024] = {};
  const std::size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  const char* p = nullptr;  // past the last ')': state is field 3, utime 14, stime 15
  for (std::size_t i = 0; i < n; ++i)
    if (buf[i] == ')') p = buf + i + 1;
  unsigned long long utime = 0, stime = 0;
  if (p == nullptr || std::sscanf(p, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
    return -1;
  return static_cast<double>(utime + stime) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// Each thread of `pid`: its state and the kernel function it waits in, for
// a failure's log (" tid S wchan; ...").
inline std::string describe_threads(pid_t pid) {
  std::string out;
  const std::string task = "/proc/" + std::to_string(pid) + "/task";
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator(task, ec)) {
    const std::string tid = t.path().filename().string();
    std::string wchan;
    if (std::FILE* f = std::fopen((t.path() / "wchan").c_str(), "r")) {
      char buf[128] = {};
      wchan.assign(buf, std::fread(buf, 1, sizeof buf - 1, f));
      std::fclose(f);
    }
    out += " " + tid + " " + process_state(static_cast<pid_t>(std::stol(tid))) + " " + (wchan.empty() ? "-" : wchan) + ";";
  }
  return out.empty() ? " (no such process)" : out;
}

// Sends `sig` and returns once the kernel reports its effect: stopped ('T')
// after SIGSTOP, running again after SIGCONT. kill() returning does not mean
// that: a group stop takes effect only once one of the target's threads has
// dequeued the signal, and a spinning thread can do work meanwhile. Throws
// when the state does not come within 10 s. (SIGKILL: the caller reaps.)
inline void signal_and_wait(pid_t pid, int sig) {
  if (::kill(pid, sig) != 0) throw std::runtime_error("kill(" + std::to_string(pid) + "): no such process");
  if (sig != SIGSTOP && sig != SIGCONT) return;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    const char st = process_state(pid);
    if (st == 0) throw std::runtime_error("process " + std::to_string(pid) + " is gone");
    if ((sig == SIGSTOP) == (st == 'T')) return;
    if (std::chrono::steady_clock::now() > end)
      throw std::runtime_error("process " + std::to_string(pid) + " did not reach the state of signal " +
                               std::to_string(sig) + " within 10 s (state " + st + ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The resident set of `pid` in bytes (VmRSS), 0 if unknown.
inline std::uint64_t resident_bytes(pid_t pid) {
  std::FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "r");
  if (f == nullptr) return 0;
  char line[256];
  std::uint64_t kb = 0;
  while (std::fgets(line, sizeof line, f))
    if (std::sscanf(line, "VmRSS: %lu kB", &kb) == 1) break;
  std::fclose(f);
  return kb * 1024;
}

// A helper binary built next to the running test executable.
inline std::string sibling_binary(const std::string& name) {
  return (std::filesystem::read_symlink("/proc/self/exe").parent_path() / name).string();
}

class ChildProcess {
 public:
  explicit ChildProcess(const std::vector<std::string>& args) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    if (::posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ) != 0) {
      pid_ = -1;
      output_ = "posix_spawn failed";
    }
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    out_ = fds[0];
  }
  ~ChildProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
  }
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }

  // Reads output until it contains `text`, EOF, or the timeout.
  bool wait_for_output(const std::string& text, std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (output_.find(text) == std::string::npos) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !read_some(static_cast<int>(left.count()))) return false;
    }
    return true;
  }
  // SIGSTOP and SIGCONT return once they have taken effect.
  void signal(int sig) {
    if (pid_ > 0) signal_and_wait(pid_, sig);
  }
  // Reads the rest of the output and reaps the process; one still running
  // after `bound` is killed (exit_code -1): a test never hangs on a process
  // that should have exited and did not.
  ProcessResult wait(std::chrono::milliseconds bound = std::chrono::minutes(2)) {
    const auto end = std::chrono::steady_clock::now() + bound;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !read_some(static_cast<int>(left.count()))) break;
    }
    ProcessResult r;
    if (out_ >= 0 && pid_ > 0) {  // no EOF within the bound
      ::kill(pid_, SIGKILL);
      output_ += "\n[still running after " + std::to_string(bound.count()) + " ms: killed]\n";
    }
    r.output = output_;
    if (pid_ > 0) {
      int status = 0;
      ::waitpid(pid_, &status, 0);
      pid_ = -1;
      if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    }
    return r;
  }

 private:
  bool read_some(int timeout_ms) {
    if (out_ < 0) return false;
    pollfd p{out_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    const ssize_t n = ::read(out_, buf, sizeof buf);
    if (n <= 0) {
      ::close(out_);
      out_ = -1;
      return false;
    }
    output_.append(buf, static_cast<std::size_t>(n));
    return true;
  }

  pid_t pid_ = -1;
  int out_ = -1;
  std::string output_;
};

inline ProcessResult run_process(const std::vector<std::string>& args,
                                 std::chrono::milliseconds bound = std::chrono::minutes(2)) {
  return ChildProcess(args).wait(bound);
}

}  // namespace kvstrand::test
