// One file descriptor passed with bytes over a Unix-domain socket
// (SCM_RIGHTS): how kvstrand-server hands its arena to a client.
#pragma once

#include <sys/types.h>

#include <cstddef>

namespace kvstrand::channel {

// Sends up to `n` bytes with `fd` attached to the first. Returns the bytes
// sent, or -1 with errno set (`flags` as for sendmsg; MSG_NOSIGNAL is added).
ssize_t send_with_fd(int sock, const void* data, std::size_t n, int fd, int flags);

// Receives up to `n` bytes; a descriptor that came with them is stored in
// `*fd` (close-on-exec), which is left as it was otherwise. Returns the
// bytes received, 0 at EOF, or -1 with errno set.
ssize_t recv_with_fd(int sock, void* data, std::size_t n, int* fd, int flags);

}  // namespace kvstrand::channel
