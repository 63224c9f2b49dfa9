#include "channel/blocking_client.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "channel/fd_passing.hpp"

namespace kvstrand::channel {

using common::Expected;
using common::unexpected;

std::string BlockingClient::connect(const std::string& socket) {
  close();
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket.size() >= sizeof addr.sun_path) return "the socket path is longer than 107 bytes";
  std::memcpy(addr.sun_path, socket.c_str(), socket.size() + 1);
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return std::string("socket: ") + std::strerror(errno);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int e = errno;
    close();
    return std::string("connect: ") + std::strerror(e);
  }
  return {};
}

std::string BlockingClient::open(const std::string& socket, const std::string& who, proto::HelloReply* hello) {
  if (std::string why = connect(socket); !why.empty()) return why;
  auto reply = this->hello(who);
  if (!reply) return reply.why();
  if (reply->status != proto::Status::ok) return "it refused the hello: " + reply->message;
  const auto* hr = std::get_if<proto::HelloReply>(&reply->payload);
  if (hr == nullptr) return "a reply of another type than hello";
  *hello = *hr;
  return {};
}

void BlockingClient::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Expected<proto::Reply> BlockingClient::hello(const std::string& who, const std::string& reads, int* arena_fd) {
  const std::uint64_t id = next_id_++;
  if (!send_bytes(proto::encode_request(proto::Hello{proto::kMajor, proto::kMinor, who, reads}, id)))
    return unexpected(std::string("send: ") + std::strerror(errno));
  return read_reply(id, arena_fd);
}

Expected<proto::Reply> BlockingClient::call(const proto::Request& request) {
  const std::uint64_t id = next_id_++;
  if (!send_bytes(proto::encode_request(request, id))) return unexpected(std::string("send: ") + std::strerror(errno));
  return read_reply(id);
}

bool BlockingClient::send_bytes(std::span<const std::byte> bytes) {
  if (fd_ < 0) return false;
  for (std::size_t off = 0; off < bytes.size();) {
    const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<std::size_t>(n);
  }
  return true;
}

bool BlockingClient::read_exact(std::byte* out, std::size_t n) {
  for (std::size_t off = 0; off < n;) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(bound_.count())) <= 0) return false;
    const ssize_t r = ::recv(fd_, out + off, n - off, 0);
    if (r <= 0) return false;
    off += static_cast<std::size_t>(r);
  }
  return true;
}

Expected<proto::Reply> BlockingClient::read_reply(std::uint64_t expect_id, int* passed_fd) {
  if (passed_fd != nullptr) *passed_fd = -1;
  if (fd_ < 0) return unexpected("not connected");
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(bound_.count())) <= 0)
    return unexpected("no reply within " + std::to_string(bound_.count()) + " ms");
  std::array<std::byte, proto::kHeaderBytes> head{};
  // One byte first: a descriptor (the hello reply's arena) comes with it.
  int passed = -1;
  const ssize_t first = recv_with_fd(fd_, head.data(), 1, &passed, 0);
  if (passed_fd != nullptr) {
    *passed_fd = passed;
  } else if (passed >= 0) {
    ::close(passed);
  }
  if (first != 1 || !read_exact(head.data() + 1, head.size() - 1))
    return unexpected("the connection closed before a reply");
  proto::Header h;
  if (proto::decode_header(head, proto::kDefaultMaxBody, &h) != proto::HeaderError::none)
    return unexpected("it does not speak kvstrand protocol " + std::to_string(proto::kMajor));
  std::vector<std::byte> body(h.body_bytes);
  if (!read_exact(body.data(), body.size())) return unexpected("a reply cut short");
  if (expect_id != 0 && h.request_id != expect_id)
    return unexpected("a reply to request " + std::to_string(h.request_id) + ", not " + std::to_string(expect_id));
  auto reply = proto::decode_reply(h.type, body);
  if (!reply) return unexpected("an undecodable reply: " + reply.why());
  return *reply;
}

}  // namespace kvstrand::channel
