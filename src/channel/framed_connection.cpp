#include "channel/framed_connection.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <chrono>
#include <utility>

#include "common/await_codes.hpp"
#include "channel/fd_passing.hpp"
#include "common/log_escaped.hpp"

namespace kvstrand::channel {

using common::Gate;
using common::kAwait;
using common::LogEscaped;
using common::Strand;

namespace asio = boost::asio;
using boost::system::error_code;

namespace {
constexpr std::size_t kBodyPiece = 64 * 1024;

error_code from_errno() { return error_code(errno, boost::system::system_category()); }
}  // namespace

FramedConnection::FramedConnection(Socket sock, Strand strand, Gate& gate, Ended ended)
    : sock_(std::move(sock)), strand_(std::move(strand)), gate_(gate), ended_(std::move(ended)), drained_(strand_) {}

FramedConnection::~FramedConnection() {
  error_code ignored;
  sock_.close(ignored);
}

void FramedConnection::send(std::vector<std::byte> frame, int fd, bool after_this_handler) {
  if (closed_) return;
  queued_bytes_ += frame.size();
  outbox_.push_back(Frame{std::move(frame), fd});
  if (writing_) return;
  std::weak_ptr<FramedConnection> weak = weak_from_this();
  writing_ = gate_.spawn(write_loop(shared_from_this(), after_this_handler), [weak](std::exception_ptr e) {
    if (!e) return;
    LogEscaped{"a connection's writer"}(e);
    if (auto self = weak.lock()) self->end("its writer ended by an exception");
  });
  if (!writing_) close();  // the owner is stopping: nothing more goes out
}

asio::awaitable<void> FramedConnection::write_loop(std::shared_ptr<FramedConnection> self, bool after_this_handler) {
  if (after_this_handler) co_await asio::post(self->strand_, asio::use_awaitable);
  while (!self->outbox_.empty() && !self->closed_) {
    const error_code ec = co_await self->write(self->outbox_.front());
    if (self->closed_) break;  // closed meanwhile: nothing more goes out
    if (ec) {
      self->end("write failed: " + ec.message());
      break;
    }
    self->queued_bytes_ -= self->outbox_.front().bytes.size();
    self->outbox_.pop_front();
    self->drained_.notify();
  }
  self->writing_ = false;
  if (self->flush_then_end_ && self->outbox_.empty()) self->end(self->flush_why_);
}

asio::awaitable<error_code> FramedConnection::write(const Frame& f) {
  std::size_t sent = 0;
  // The descriptor rides on the first byte that goes: sendmsg by hand until
  // one has (a full socket buffer is waited out, not spun on).
  while (f.fd >= 0 && sent == 0 && !f.bytes.empty()) {
    auto [ec] = co_await sock_.async_wait(Socket::wait_write, kAwait);
    if (ec) co_return ec;
    const ssize_t n = send_with_fd(sock_.native_handle(), f.bytes.data(), f.bytes.size(), f.fd, MSG_DONTWAIT);
    if (n >= 0) {
      sent = static_cast<std::size_t>(n);
    } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      co_return from_errno();
    }
  }
  if (sent < f.bytes.size()) {
    auto [ec, n] = co_await asio::async_write(sock_, asio::buffer(f.bytes.data() + sent, f.bytes.size() - sent), kAwait);
    co_return ec;
  }
  co_return error_code{};
}

asio::awaitable<error_code> FramedConnection::read_head(std::span<std::byte> head, int* fd) {
  *fd = -1;
  std::size_t got = 0;
  while (got < head.size()) {
    auto [ec] = co_await sock_.async_wait(Socket::wait_read, kAwait);
    if (ec) co_return ec;
    int came = -1;
    const ssize_t n = recv_with_fd(sock_.native_handle(), head.data() + got, head.size() - got, &came, MSG_DONTWAIT);
    if (n == 0) co_return asio::error::eof;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      co_return from_errno();
    }
    if (came >= 0 && *fd < 0) {
      *fd = came;
    } else if (came >= 0) {
      ::close(came);  // only the first descriptor is the one the frame carries
    }
    got += static_cast<std::size_t>(n);
  }
  co_return error_code{};
}

asio::awaitable<ReadFrame> FramedConnection::read(std::uint32_t max_body, int* fd) {
  ReadFrame f;
  std::array<std::byte, proto::kHeaderBytes> head{};
  if (fd != nullptr) {
    f.io = co_await read_head(head, fd);
  } else {
    auto [ec, n] = co_await asio::async_read(sock_, asio::buffer(head), kAwait);
    f.io = ec;
  }
  if (f.io) co_return f;
  if ((f.header = proto::decode_header(head, max_body, &f.h)) != proto::HeaderError::none) co_return f;
  while (f.body.size() < f.h.body_bytes) {
    const std::size_t at = f.body.size();
    f.body.resize(at + std::min<std::size_t>(kBodyPiece, f.h.body_bytes - at));
    auto [ec, n] = co_await asio::async_read(sock_, asio::buffer(f.body.data() + at, f.body.size() - at), kAwait);
    if ((f.io = ec)) co_return f;
  }
  co_return f;
}

asio::awaitable<void> FramedConnection::drained_to(std::uint64_t limit) {
  while (queued_bytes_ > limit && !closed_) {
    co_await drained_.wait();  // notified as the queue shrinks, and by close()
  }
}

void FramedConnection::close_after_flush(std::string why) {
  flush_then_end_ = true;
  flush_why_ = std::move(why);
  if (!writing_ && outbox_.empty()) end(flush_why_);
}

void FramedConnection::close() {
  if (closed_) return;
  closed_ = true;
  error_code ignored;
  sock_.close(ignored);
  drained_.notify();
  // A write in flight still names the front frame's bytes: it stays until
  // the writer has seen its write end.
  if (writing_ && !outbox_.empty()) {
    outbox_.erase(outbox_.begin() + 1, outbox_.end());
  } else {
    outbox_.clear();
  }
  queued_bytes_ = 0;
}

void FramedConnection::end(const std::string& why) {
  if (closed_) return;
  close();
  if (ended_) ended_(why);
}

}  // namespace kvstrand::channel
