#include "server/admin_client.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "common/fd_passing.hpp"

namespace kvstrand::server {

namespace {

constexpr int kReplyWaitMs = 5000;  // each reply's bound

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

}  // namespace

AdminClient::~AdminClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string AdminClient::open(const std::string& socket, const std::string& who) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket.size() >= sizeof addr.sun_path) return "the socket path is longer than 107 bytes";
  std::memcpy(addr.sun_path, socket.c_str(), socket.size() + 1);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return std::string("connect: ") + std::strerror(errno);
  auto reply = call(proto::Hello{proto::kMajor, proto::kMinor, who, {}});
  if (!reply) return reply.why();
  if (reply->status != proto::Status::ok) return "it refused the hello: " + reply->message;
  const auto* hr = std::get_if<proto::HelloReply>(&reply->payload);
  if (hr == nullptr) return "a reply of another type than hello";
  hello_ = *hr;
  return {};
}

common::Expected<proto::Reply> AdminClient::call(const proto::Request& request) {
  const auto frame = proto::encode_request(request, next_id_++);
  if (::send(fd_, frame.data(), frame.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(frame.size()))
    return common::unexpected(std::string("send: ") + std::strerror(errno));
  return read_reply();
}

common::Expected<proto::Reply> AdminClient::read_reply() {
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, kReplyWaitMs) <= 0) return common::unexpected("no reply within 5 s");
  std::array<std::byte, proto::kHeaderBytes> head{};
  int passed = -1;  // the hello reply's arena: not used here
  const ssize_t first = common::recv_with_fd(fd_, head.data(), 1, &passed, 0);
  if (passed >= 0) ::close(passed);
  if (first != 1 || !read_exact(fd_, head.data() + 1, head.size() - 1))
    return common::unexpected("the connection closed before a reply");
  proto::Header h;
  if (proto::decode_header(head, proto::kDefaultMaxBody, &h) != proto::HeaderError::none)
    return common::unexpected("it does not speak kvstrand protocol " + std::to_string(proto::kMajor));
  std::vector<std::byte> body(h.body_bytes);
  if (!read_exact(fd_, body.data(), body.size())) return common::unexpected("a reply cut short");
  auto reply = proto::decode_reply(h.type, body);
  if (!reply) return common::unexpected("an undecodable reply: " + reply.why());
  return *reply;
}

}  // namespace kvstrand::server
