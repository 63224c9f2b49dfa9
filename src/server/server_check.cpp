#include "server/server_check.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "common/parse_bytes.hpp"
#include "proto/protocol.hpp"
#include "common/fd_passing.hpp"

namespace kvstrand::server {

namespace {

constexpr int kReplyWaitMs = 5000;  // one try's bound on the hello reply

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

bool read_exact(int fd, std::byte* out, std::size_t n) {
  for (std::size_t off = 0; off < n;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, kReplyWaitMs) <= 0) return false;
    const ssize_t r = ::recv(fd, out + off, n - off, 0);
    if (r <= 0) return false;
    off += static_cast<std::size_t>(r);
  }
  return true;
}

// One hello: empty when answered (its reply in *out), else why not.
std::string hello_once(const std::string& path, proto::HelloReply* out) {
  Fd s{::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) return "the socket path is longer than 107 bytes";
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::connect(s.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return std::string("connect: ") + std::strerror(errno);
  const auto frame = proto::encode_request(proto::Hello{proto::kMajor, proto::kMinor, "kvstrand-server --check"}, 1);
  if (::send(s.fd, frame.data(), frame.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(frame.size()))
    return std::string("send: ") + std::strerror(errno);
  pollfd p{s.fd, POLLIN, 0};
  if (::poll(&p, 1, kReplyWaitMs) <= 0) return "no hello reply within 5 s";
  std::array<std::byte, proto::kHeaderBytes> head{};
  Fd arena;  // the server's arena comes with the reply's first byte: closed unused
  if (common::recv_with_fd(s.fd, head.data(), 1, &arena.fd, 0) != 1 || !read_exact(s.fd, head.data() + 1, head.size() - 1))
    return "the connection closed before a hello reply";
  proto::Header h;
  if (proto::decode_header(head, proto::kDefaultMaxBody, &h) != proto::HeaderError::none)
    return "it does not speak kvstrand protocol " + std::to_string(proto::kMajor);
  std::vector<std::byte> body(h.body_bytes);
  if (!read_exact(s.fd, body.data(), body.size())) return "the hello reply was cut short";
  auto reply = proto::decode_reply(h.type, body);
  if (!reply) return "an undecodable hello reply: " + reply.why();
  if (reply->status != proto::Status::ok) return "it refused the hello: " + reply->message;
  const auto* hr = std::get_if<proto::HelloReply>(&reply->payload);
  if (hr == nullptr) return "a reply of another type than hello";
  *out = *hr;
  return {};
}

}  // namespace

int check_server(const std::string& socket, std::chrono::milliseconds within) {
  const auto end = std::chrono::steady_clock::now() + within;
  std::string why;
  for (;;) {
    proto::HelloReply hr;
    why = hello_once(socket, &hr);
    if (why.empty()) {
      std::printf("kvstrand-server at %s answers: protocol %u.%u, arena %s\n", socket.c_str(), unsigned{hr.major},
                  unsigned{hr.minor}, common::format_bytes(hr.arena_bytes).c_str());
      return 0;
    }
    if (std::chrono::steady_clock::now() >= end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::fprintf(stderr, "kvstrand-server --check: no server answers at %s: %s\n", socket.c_str(), why.c_str());
  return 1;
}

}  // namespace kvstrand::server
