// A real kvstrand-server process for the tests, and the blocking protocol
// client they talk to it with (every wait bounded by a timeout).
#pragma once

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <stdexcept>

#include "proto/protocol.hpp"
#include "channel/blocking_client.hpp"
#include "channel/fd_passing.hpp"
#include "process.hpp"

namespace kvstrand::test {

class ServerProcess {
 public:
  // A server on a fresh socket path, or on `socket` (a restart on the path
  // a killed server left).
  explicit ServerProcess(std::vector<std::string> extra = {}, std::string socket = {})
      : socket_(socket.empty() ? fresh_socket_path() : std::move(socket)) {
    spawn(extra);
  }
  ~ServerProcess() {
    kill(SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(300)); ::unlink(socket_.c_str());  // a killed server leaves its socket file
  }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // A new server on the same socket path, in this object: the old one is
  // killed (if it still runs) and its socket file is left for the new one to
  // find, as a crash leaves it. (Two objects on one path would not do: the
  // old one's destructor unlinks the path after the new server bound it.)
  void restart(const std::vector<std::string>& extra = {}) {
    kill(SIGKILL);
    spawn(extra);
  }

  const std::string& socket_path() const { return socket_; }
  pid_t pid() const { return pid_; }

  // True once the server accepts connections (within 30 s). Otherwise says
  // on stderr why not: the server exited (its status), or where each of its
  // threads waits (state and kernel wait channel), for the test's log.
  bool ready() {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < end) {
      if (const int fd = connect_to(socket_); fd >= 0) {
        ::close(fd);
        return true;
      }
      int status = 0;
      if (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
        std::fprintf(stderr, "ServerProcess: kvstrand-server (pid %d) on %s exited at start, status %d\n", pid_,
                     socket_.c_str(), status);
        pid_ = -1;
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::fprintf(stderr, "ServerProcess: kvstrand-server (pid %d) does not accept on %s after 30 s:%s\n", pid_,
                 socket_.c_str(), describe_threads(pid_).c_str());
    return false;
  }
  // SIGSTOP and SIGCONT return once they have taken effect; SIGKILL, SIGTERM
  // and SIGINT once the server is reaped.
  void kill(int sig) {
    if (pid_ <= 0) return;
    signal_and_wait(pid_, sig);
    if (sig == SIGKILL || sig == SIGTERM || sig == SIGINT) {
      int status = 0;
      ::waitpid(pid_, &status, 0);
      pid_ = -1;
    }
  }

  // Removed when this test process exits: a server a case SIGKILLs (or
  // starts without a ServerProcess) leaves its socket file behind.
  static std::string fresh_socket_path() {
    struct Made {
      std::vector<std::string> paths;
      ~Made() {
        for (const std::string& p : paths) ::unlink(p.c_str());
      }
    };
    static Made made;
    std::string p = "/tmp/kvstrand-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++) + ".sock";
    made.paths.push_back(p);
    return p;
  }

  static int connect_to(const std::string& path) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }

 private:
  void spawn(const std::vector<std::string>& extra) {
    std::vector<std::string> args = {sibling_binary("../kvstrand-server"), "--socket", socket_, "--log-level",
                                     "warn"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (::posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ) != 0) pid_ = -1;
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::string socket_;
  pid_t pid_ = -1;
};

// The tests' client: channel::BlockingClient (what the command line's
// one-shot requests use too), with the raw socket's reads and writes a test
// of malformed frames needs, and answers as optionals for REQUIRE.
class Client {
 public:
  explicit Client(const std::string& path) { (void)conn_.connect(path); }
  void close() { conn_.close(); }
  bool connected() const { return conn_.connected(); }
  int fd() const { return conn_.fd(); }

  bool send_raw(const std::vector<std::byte>& bytes) { return conn_.send_bytes(bytes); }
  // Reads exactly n bytes within the timeout; false on EOF, error or timeout.
  bool read_exact(std::byte* out, std::size_t n, int timeout_ms = 10000) {
    std::size_t off = 0;
    while (off < n) {
      pollfd p{fd(), POLLIN, 0};
      if (::poll(&p, 1, timeout_ms) <= 0) return false;
      const ssize_t r = ::recv(fd(), out + off, n - off, 0);
      if (r <= 0) return false;
      off += static_cast<std::size_t>(r);
    }
    return true;
  }
  // The server closed the connection within the timeout (EOF, or a reset
  // when it closed with our bytes unread).
  bool closed_by_server(int timeout_ms = 10000) {
    std::byte b;
    pollfd p{fd(), POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    return ::recv(fd(), &b, 1, 0) <= 0;
  }

  // Hello, receiving the arena's file descriptor with the reply (-1 if none
  // came). The caller owns the descriptor. `reads`: a published tenant to read.
  std::optional<proto::Reply> hello(int* arena_fd, const std::string& reads = {}) {
    return answer(conn_.hello("test", reads, arena_fd));
  }
  std::optional<proto::Reply> call(const proto::Request& req) { return answer(conn_.call(req)); }
  // For a forked child, where a failed REQUIRE cannot report: no answer throws.
  proto::Reply call_or_throw(const proto::Request& req) {
    auto r = call(req);
    if (!r) throw std::runtime_error("no answer");
    return std::move(*r);
  }
  // Waits until the server's whole arena is populated (its filler thread
  // runs beside the clients; on a loaded host a chunk saved early can be
  // refused as full). False if that does not happen within `within`.
  bool wait_full(std::chrono::seconds within = std::chrono::seconds(30)) {
    int arena = -1;
    auto h = hello(&arena);
    if (arena >= 0) ::close(arena);
    if (!h || h->status != proto::Status::ok) return false;
    const auto end = std::chrono::steady_clock::now() + within;
    while (std::chrono::steady_clock::now() < end) {
      auto r = call(proto::Stats{});
      if (!r || r->status != proto::Status::ok) return false;
      const auto& s = std::get<proto::StatsReply>(r->payload);
      if (s.ready_bytes >= s.capacity_bytes) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return false;
  }
  // The next reply; `expect_id` 0 takes any.
  std::optional<proto::Reply> read_reply(std::uint64_t expect_id) { return answer(conn_.read_reply(expect_id)); }

 private:
  static std::optional<proto::Reply> answer(common::Expected<proto::Reply> r) {
    if (!r) return std::nullopt;
    return std::move(*r);
  }
  channel::BlockingClient conn_{std::chrono::seconds(10)};
};

// The server accepts, and its whole arena is populated: what a test that
// expects its first saves to find room needs.
inline bool ready_and_full(ServerProcess& s) { return s.ready() && Client(s.socket_path()).wait_full(); }

}  // namespace kvstrand::test
