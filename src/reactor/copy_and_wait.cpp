#include "reactor/copy_and_wait.hpp"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "reactor/transfer_error.hpp"

namespace kvstrand::reactor {

namespace asio = boost::asio;

boost::asio::awaitable<CopyEnd> copy_and_wait(Reactor& reactor, hip::Stream& stream, hip::CopyKind kind,
                                              std::vector<hip::Segment> segs,
                                              const std::function<void(hip::Stream&)>& queued) {
  if (hip::Status s = hip::copy_batch(stream, kind, segs); !s.ok())
    co_return CopyEnd{Failure{TransferErrc::device_error, s.describe()}};
  auto lease = reactor.events().acquire();
  if (!lease.ok() || !lease->record(stream).ok()) {
    // The copy is queued but has no event to await (only a broken runtime
    // gets here). The strand never waits on the device: poll the stream
    // until it has drained instead, with the strand free in between; the
    // transfer's deadline still bounds what the engine waits.
    std::string why = lease.ok() ? "event record failed" : lease.status().describe();
    asio::steady_timer poll(reactor.strand());
    for (;;) {
      const hip::Status q = stream.query();
      if (q.code() != hip::Errc::not_ready) break;
      poll.expires_after(std::chrono::microseconds(200));
      boost::system::error_code ec;
      co_await poll.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      if (ec)  // shutdown: the copy may still be running
        co_return CopyEnd{Failure{std::make_error_code(std::errc::operation_canceled), why}, false};
    }
    co_return CopyEnd{Failure{TransferErrc::device_error, why}};
  }
  if (queued) queued(stream);
  std::error_code ec = co_await reactor.poller().ready(lease->event());
  if (ec == std::errc::operation_canceled)  // shutdown: the copy may still be running
    co_return CopyEnd{Failure{ec, "reactor shut down before the copy was seen complete"}, false};
  if (ec) co_return CopyEnd{Failure{TransferErrc::device_error, "device: " + ec.message()}};
  co_return CopyEnd{};
}

}  // namespace kvstrand::reactor
