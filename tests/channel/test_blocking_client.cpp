// channel::BlockingClient: kvstrand-server's protocol one request at a time,
// against a scripted peer on a real Unix socket (the real server's side is
// in the server's tests, which talk to it through this client).
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "channel/blocking_client.hpp"
#include "channel/fd_passing.hpp"

using namespace kvstrand;
using namespace std::chrono_literals;

namespace {

// A listening socket whose one connection is served by `serve` on a thread.
class Peer {
 public:
  explicit Peer(std::function<void(int)> serve)
      : path_("/tmp/kvstrand-blocking-client-" + std::to_string(::getpid()) + "-" + std::to_string(++count_) + ".sock") {
    listen_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strcpy(addr.sun_path, path_.c_str());
    ::unlink(path_.c_str());
    REQUIRE(::bind(listen_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    REQUIRE(::listen(listen_, 4) == 0);
    thread_ = std::thread([this, serve = std::move(serve)] {
      const int fd = ::accept(listen_, nullptr, nullptr);
      if (fd < 0) return;
      accepted_ = fd;
      serve(fd);
      accepted_ = -1;
      ::close(fd);
    });
  }
  ~Peer() {
    // Both shut down, so that a serve() still waiting on its client ends
    // (a test that failed leaves one waiting).
    ::shutdown(listen_, SHUT_RDWR);
    if (const int fd = accepted_; fd >= 0) ::shutdown(fd, SHUT_RDWR);
    if (thread_.joinable()) thread_.join();
    ::close(listen_);
    ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }

 private:
  static inline int count_ = 0;
  std::string path_;
  int listen_ = -1;
  std::atomic<int> accepted_{-1};
  std::thread thread_;
};

// Reads one request frame; its id.
std::uint64_t read_request(int fd) {
  std::array<std::byte, proto::kHeaderBytes> head{};
  if (::recv(fd, head.data(), head.size(), MSG_WAITALL) != static_cast<ssize_t>(head.size())) return 0;
  proto::Header h;
  if (proto::decode_header(head, proto::kDefaultMaxBody, &h) != proto::HeaderError::none) return 0;
  std::vector<std::byte> body(h.body_bytes);
  if (!body.empty() && ::recv(fd, body.data(), body.size(), MSG_WAITALL) != static_cast<ssize_t>(body.size())) return 0;
  return h.request_id;
}

proto::Reply hello_reply() {
  return proto::Reply{proto::Status::ok, "", proto::HelloReply{7, proto::kMajor, proto::kMinor, 1 << 20, 1 << 20, 0, false}};
}

// A peer answering the first request with `reply` as a `type` reply, then
// waiting for the client to close.
std::function<void(int)> answers(proto::Type type, proto::Reply reply) {
  return [type, reply = std::move(reply)](int fd) {
    const auto frame = proto::encode_reply(type, read_request(fd), reply);
    ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
    read_request(fd);
  };
}

int open_fds() {
  return static_cast<int>(std::distance(std::filesystem::directory_iterator("/proc/self/fd"), {}));
}

}  // namespace

TEST_CASE("blocking client: a hello's reply brings the descriptor sent with it, the caller's or closed",
          "[common][client]") {
  int memfd = ::memfd_create("arena", MFD_CLOEXEC);
  REQUIRE(memfd >= 0);
  Peer peer([&](int fd) {
    for (int i = 0; i < 2; ++i) {
      const std::uint64_t id = read_request(fd);
      const auto frame = proto::encode_reply(proto::Type::hello, id, hello_reply());
      // (No REQUIRE on this thread: the client's side says what went wrong.)
      if (channel::send_with_fd(fd, frame.data(), frame.size(), memfd, 0) != static_cast<ssize_t>(frame.size())) return;
    }
    read_request(fd);  // until the client closes: this end's descriptor stays open while it counts
  });
  channel::BlockingClient c;
  REQUIRE(c.connect(peer.path()).empty());
  int arena = -1;
  auto r = c.hello("test", {}, &arena);
  REQUIRE(r);
  REQUIRE(std::get<proto::HelloReply>(r->payload).session == 7);
  REQUIRE(arena >= 0);
  ::close(arena);
  // Not asked for: closed here, not leaked.
  const int before = open_fds();
  REQUIRE(c.hello("test"));
  REQUIRE(open_fds() == before);
  ::close(memfd);
}

TEST_CASE("blocking client: no reply within its bound, a reply to another request, or a peer gone, each says why",
          "[common][client]") {
  SECTION("silent") {
    Peer peer([](int fd) {
      read_request(fd);
      std::this_thread::sleep_for(500ms);
    });
    channel::BlockingClient c(100ms);
    REQUIRE(c.connect(peer.path()).empty());
    auto r = c.call(proto::Stats{});
    REQUIRE_FALSE(r);
    REQUIRE(r.why() == "no reply within 100 ms");
  }
  SECTION("another request's reply") {
    Peer peer([](int fd) {
      const std::uint64_t id = read_request(fd);
      const auto frame =
          proto::encode_reply(proto::Type::stats, id + 1, proto::Reply{proto::Status::ok, "", proto::StatsReply{}});
      ::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
    });
    channel::BlockingClient c;
    REQUIRE(c.connect(peer.path()).empty());
    auto r = c.call(proto::Stats{});
    REQUIRE_FALSE(r);
    REQUIRE(r.why().find("a reply to request") == 0);
  }
  SECTION("gone") {
    Peer peer([](int fd) { read_request(fd); });
    channel::BlockingClient c;
    REQUIRE(c.connect(peer.path()).empty());
    auto r = c.call(proto::Stats{});
    REQUIRE_FALSE(r);
    REQUIRE(r.why() == "the connection closed before a reply");
  }
  SECTION("nobody there") {
    channel::BlockingClient c;
    REQUIRE(c.connect("/tmp/kvstrand-no-such-socket-" + std::to_string(::getpid())).find("connect: ") == 0);
    REQUIRE_FALSE(c.connected());
    REQUIRE_FALSE(c.call(proto::Stats{}));
  }
}

TEST_CASE("blocking client: connecting again closes the last connection", "[common][client]") {
  std::atomic<bool> a_closed{false};
  Peer a([&](int fd) {
    std::byte b;
    if (::recv(fd, &b, 1, 0) == 0) a_closed = true;  // EOF: the client closed its end
  });
  Peer b([](int fd) { read_request(fd); });
  channel::BlockingClient c;
  REQUIRE(c.connect(a.path()).empty());
  REQUIRE(c.connect(b.path()).empty());
  for (int i = 0; i < 200 && !a_closed; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(a_closed);
}

TEST_CASE("blocking client: open() is connect and hello for a person: the reply, or why not in words",
          "[common][client]") {
  SECTION("answered") {
    Peer peer(answers(proto::Type::hello, hello_reply()));
    channel::BlockingClient c;
    proto::HelloReply hr;
    REQUIRE(c.open(peer.path(), "test", &hr).empty());
    REQUIRE(hr.session == 7);
  }
  SECTION("refused") {
    Peer peer(answers(proto::Type::hello, proto::Reply{proto::Status::not_authorized, "no", proto::Empty{}}));
    channel::BlockingClient c;
    proto::HelloReply hr;
    REQUIRE(c.open(peer.path(), "test", &hr) == "it refused the hello: no");
  }
  SECTION("answered with another type") {
    Peer peer(answers(proto::Type::stats, proto::Reply{proto::Status::ok, "", proto::StatsReply{}}));
    channel::BlockingClient c;
    proto::HelloReply hr;
    REQUIRE(c.open(peer.path(), "test", &hr) == "a reply of another type than hello");
  }
  SECTION("a socket path longer than a Unix socket takes") {
    channel::BlockingClient c;
    REQUIRE(c.connect("/tmp/" + std::string(200, 'x')) == "the socket path is longer than 107 bytes");
    REQUIRE_FALSE(c.connected());
  }
}

TEST_CASE("blocking client: a peer gone before the request, one that stalls inside a frame, and no descriptor "
          "left to make a socket, each ends the call with why",
          "[common][client]") {
  SECTION("gone before the request: the send fails") {
    std::atomic<bool> closed{false};
    Peer peer([&](int fd) {
      ::shutdown(fd, SHUT_RDWR);
      closed = true;
    });
    channel::BlockingClient c;
    REQUIRE(c.connect(peer.path()).empty());
    for (int i = 0; i < 200 && !closed; ++i) std::this_thread::sleep_for(10ms);
    auto r = c.call(proto::Stats{});
    REQUIRE_FALSE(r);
    REQUIRE(r.why().find("send: ") == 0);
  }
  SECTION("a frame cut short, then silence: bounded") {
    Peer peer([](int fd) {
      const std::uint64_t id = read_request(fd);
      const auto frame = proto::encode_reply(proto::Type::stats, id, proto::Reply{proto::Status::ok, "", proto::StatsReply{}});
      ::send(fd, frame.data(), 5, MSG_NOSIGNAL);
      read_request(fd);  // until the client closes
    });
    channel::BlockingClient c(100ms);
    REQUIRE(c.connect(peer.path()).empty());
    auto r = c.call(proto::Stats{});
    REQUIRE_FALSE(r);
    REQUIRE(r.why() == "the connection closed before a reply");
  }
  SECTION("no descriptor left") {
    rlimit old{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &old) == 0);
    rlimit none = old;
    const int lowest_free = ::dup(0);  // every number below it is in use
    REQUIRE(lowest_free >= 0);
    ::close(lowest_free);
    none.rlim_cur = static_cast<rlim_t>(lowest_free);
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &none) == 0);
    channel::BlockingClient c;
    const std::string why = c.connect("/tmp/kvstrand-no-such-socket");
    REQUIRE(::setrlimit(RLIMIT_NOFILE, &old) == 0);
    REQUIRE(why.find("socket: ") == 0);
  }
}
