// One connection of kvstrand's protocol over a local stream socket, on one
// strand: what both ends share (each kvstrand-server session, RemoteIndex's
// connection to its server).
//
// Frames go out whole and in order through one writer coroutine inside the
// owner's gate: started by the first frame queued, ended by the last. A
// frame may carry a file descriptor with its first byte (the hello reply's
// arena). Frames come in through read(), the body in 64 KiB pieces, so that
// memory follows the bytes that arrived, not the size a header announced.
//
// The connection ends once. Its owner ends it with close(); it ends itself
// when a write fails, when its writer ends by an exception, or after its
// last frame when asked to (close_after_flush), and then tells its owner
// why (`Ended`), on the strand.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/gate.hpp"
#include "common/notifier.hpp"
#include "common/strand.hpp"
#include "proto/protocol.hpp"

namespace kvstrand::channel {

// One frame read, or why none was.
struct ReadFrame {
  boost::system::error_code io;                   // the stream failed or closed: nothing more comes
  proto::HeaderError header = proto::HeaderError::none;  // not a frame this end reads (its body is not read)
  proto::Header h;                                // decoded as far as it could be (other_major: all of it)
  std::vector<std::byte> body;
};

class FramedConnection : public std::enable_shared_from_this<FramedConnection> {
 public:
  using Socket = boost::asio::local::stream_protocol::socket;
  using Ended = std::function<void(const std::string& why)>;

  // `gate` (the owner's) holds the writer; `ended` is told when the
  // connection ends by itself. Owned through a shared_ptr: the writer holds
  // one while it runs.
  FramedConnection(Socket sock, common::Strand strand, common::Gate& gate, Ended ended);
  ~FramedConnection();
  FramedConnection(const FramedConnection&) = delete;
  FramedConnection& operator=(const FramedConnection&) = delete;

  Socket& socket() noexcept { return sock_; }
  bool closed() const noexcept { return closed_; }
  std::uint64_t queued_bytes() const noexcept { return queued_bytes_; }

  // Queues a frame; `fd` (>= 0: the caller's, open until the connection is
  // gone) goes with its first byte. `after_this_handler`: the write starts
  // once the handler that queued it has returned (for a frame no reply is
  // awaited for: the syscall, and waking the peer, come after what that
  // handler does next). Nothing, once closed.
  void send(std::vector<std::byte> frame, int fd = -1, bool after_this_handler = false);

  // The next frame. With `fd`: a descriptor that came with the header's
  // bytes is stored there (the caller's to close), -1 if none came.
  // Completes with what happened, never by throwing.
  boost::asio::awaitable<ReadFrame> read(std::uint32_t max_body, int* fd = nullptr);

  // Completes once at most `limit` bytes are queued, or the connection ended
  // (a peer that does not read its replies is not read from either).
  boost::asio::awaitable<void> drained_to(std::uint64_t limit);

  // Ends the connection once what is queued has been written; `why` is
  // what `Ended` is then told.
  void close_after_flush(std::string why);

  // Ends it now: the socket closed (what waits on it completes), what is
  // queued dropped. `Ended` is not told: the owner knows.
  void close();

 private:
  struct Frame {
    std::vector<std::byte> bytes;
    int fd = -1;
  };

  static boost::asio::awaitable<void> write_loop(std::shared_ptr<FramedConnection> self, bool after_this_handler);
  boost::asio::awaitable<boost::system::error_code> write(const Frame& f);
  boost::asio::awaitable<boost::system::error_code> read_head(std::span<std::byte> head, int* fd);
  void end(const std::string& why);

  Socket sock_;
  common::Strand strand_;
  common::Gate& gate_;
  Ended ended_;
  std::deque<Frame> outbox_;
  std::uint64_t queued_bytes_ = 0;
  common::Notifier drained_;  // notified by the writer as the queue shrinks, and by close()
  bool writing_ = false;
  bool closed_ = false;
  bool flush_then_end_ = false;
  std::string flush_why_;
};

}  // namespace kvstrand::channel
