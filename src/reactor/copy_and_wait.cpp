#include "reactor/copy_and_wait.hpp"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "reactor/transfer_error.hpp"

namespace kvstrand::reactor {

namespace asio = boost::asio;

boost::asio::awaitable<std::error_code> copy_and_wait(Reactor& reactor, Transfer& t, hip::Stream& stream,
                                                      hip::CopyKind kind, std::vector<hip::Segment> segs,
                                                      bool* copied) {
  *copied = true;
  if (hip::Status s = hip::copy_batch(stream, kind, segs); !s.ok()) {
    t.reason = s.describe();
    co_return TransferErrc::device_error;
  }
  auto lease = reactor.events().acquire();
  if (!lease.ok() || !lease->record(stream).ok()) {
    // The copy is queued but has no event to await (only a broken runtime
    // gets here). The strand never waits on the device: poll the stream
    // until it has drained instead, with the strand free in between; the
    // transfer's deadline still bounds what the engine waits.
    t.reason = lease.ok() ? "event record failed" : lease.status().describe();
    asio::steady_timer poll(reactor.strand());
    for (;;) {
      const hip::Status q = stream.query();
      if (q.code() != hip::Errc::not_ready) break;
      poll.expires_after(std::chrono::microseconds(200));
      boost::system::error_code ec;
      co_await poll.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      if (ec) {  // shutdown: the copy may still be running
        *copied = false;
        co_return std::make_error_code(std::errc::operation_canceled);
      }
    }
    co_return TransferErrc::device_error;
  }
  t.state = TransferState::pending;
  // A load's copies are queued: the engine may now order its own stream
  // after them (Connector::order_after_load).
  if (t.queued_event && t.queued_event->record(stream).ok() && t.on_queued) t.on_queued();
  std::error_code ec = co_await reactor.poller().ready(lease->event());
  if (ec == std::errc::operation_canceled) {
    *copied = false;  // shutdown: the copy may still be running
    t.reason = "reactor shut down before the copy was seen complete";
    co_return ec;
  }
  if (ec) {
    t.reason = "device: " + ec.message();
    co_return TransferErrc::device_error;
  }
  co_return std::error_code{};
}

}  // namespace kvstrand::reactor
