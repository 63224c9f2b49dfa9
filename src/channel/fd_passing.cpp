#include "channel/fd_passing.hpp"

#include <sys/socket.h>

#include <cstring>

namespace kvstrand::channel {

namespace {

// One buffer and room for one descriptor: what both directions hand the
// kernel. Points into itself, so it stays where it was made.
struct OneFdMessage {
  OneFdMessage(void* data, std::size_t n) : iov{data, n} {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  OneFdMessage(const OneFdMessage&) = delete;
  OneFdMessage& operator=(const OneFdMessage&) = delete;

  iovec iov;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
};

}  // namespace

ssize_t send_with_fd(int sock, const void* data, std::size_t n, int fd, int flags) {
  OneFdMessage m(const_cast<void*>(data), n);
  cmsghdr* c = CMSG_FIRSTHDR(&m.msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  return ::sendmsg(sock, &m.msg, flags | MSG_NOSIGNAL);
}

ssize_t recv_with_fd(int sock, void* data, std::size_t n, int* fd, int flags) {
  OneFdMessage m(data, n);
  const ssize_t got = ::recvmsg(sock, &m.msg, flags | MSG_CMSG_CLOEXEC);
  if (got < 0) return got;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m.msg); c != nullptr; c = CMSG_NXTHDR(&m.msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) std::memcpy(fd, CMSG_DATA(c), sizeof(int));
  return got;
}

}  // namespace kvstrand::channel
