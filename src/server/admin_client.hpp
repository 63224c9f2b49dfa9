// A blocking client of a running kvstrand-server, for the command line's
// one-shot requests (--check, --drop-namespace): connect, hello, then a
// request and its reply, each bounded. It talks the protocol as a client
// does.
#pragma once

#include <string>

#include "common/expected.hpp"
#include "proto/protocol.hpp"

namespace kvstrand::server {

class AdminClient {
 public:
  AdminClient() = default;
  ~AdminClient();
  AdminClient(const AdminClient&) = delete;
  AdminClient& operator=(const AdminClient&) = delete;

  // Connects to `socket` and says hello as `who`: empty once answered (the
  // reply in hello()), else why not, for a person.
  std::string open(const std::string& socket, const std::string& who);
  const proto::HelloReply& hello() const noexcept { return hello_; }
  // Sends `request` and waits for its reply (at most 5 s): the reply, or why
  // none came.
  common::Expected<proto::Reply> call(const proto::Request& request);

 private:
  // The next frame's reply, with the file descriptor that came with its
  // first byte (the hello reply's arena), closed here.
  common::Expected<proto::Reply> read_reply();

  int fd_ = -1;
  std::uint64_t next_id_ = 1;
  proto::HelloReply hello_;
};

}  // namespace kvstrand::server
