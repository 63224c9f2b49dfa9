// A blocking client of kvstrand-server's protocol, one request at a time:
// connect, hello, a request and its reply, each reply bounded. For what is
// not an engine: the command line's one-shot requests (--check, --drop-*),
// the tests and the benchmarks. (An engine talks through RemoteIndex, a
// coroutine on its strand.)
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "common/expected.hpp"
#include "proto/protocol.hpp"

namespace kvstrand::channel {

class BlockingClient {
 public:
  explicit BlockingClient(std::chrono::milliseconds reply_bound = std::chrono::seconds(5)) : bound_(reply_bound) {}
  ~BlockingClient() { close(); }
  BlockingClient(const BlockingClient&) = delete;
  BlockingClient& operator=(const BlockingClient&) = delete;

  // Connects to the server's socket: empty once connected, else why not.
  std::string connect(const std::string& socket);
  bool connected() const noexcept { return fd_ >= 0; }
  int fd() const noexcept { return fd_; }
  void close();

  // connect() then hello() as `who`, for a person: empty once the server
  // answered the hello (its reply in *hello), else why not.
  std::string open(const std::string& socket, const std::string& who, proto::HelloReply* hello);
  // Hello as `who` (a reader of `reads`'s published prefixes when named).
  // The arena's descriptor comes with the reply: the caller's in *arena_fd,
  // else closed here. A refused hello is a reply too (its status says).
  common::Expected<proto::Reply> hello(const std::string& who, const std::string& reads = {}, int* arena_fd = nullptr);
  // Sends `request` and waits for its reply: the reply, or why none came.
  common::Expected<proto::Reply> call(const proto::Request& request);
  // Bytes as they are (a test's malformed frame): false unless all went.
  bool send_bytes(std::span<const std::byte> bytes);
  // The next frame, decoded as a reply: `expect_id` 0 takes any id. A
  // descriptor that came with its first byte is the caller's in *passed_fd,
  // else closed here.
  common::Expected<proto::Reply> read_reply(std::uint64_t expect_id = 0, int* passed_fd = nullptr);
  std::uint64_t next_id() noexcept { return next_id_++; }

 private:
  bool read_exact(std::byte* out, std::size_t n);

  std::chrono::milliseconds bound_;  // each read's wait
  int fd_ = -1;
  std::uint64_t next_id_ = 1;
};

}  // namespace kvstrand::channel
