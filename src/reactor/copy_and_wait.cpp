#include "reactor/copy_and_wait.hpp"

#include "reactor/transfer_error.hpp"

namespace kvstrand::reactor {

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
    // The copy is queued but cannot be awaited: wait it out on the stream's
    // terms by synchronising, which only a broken runtime ever gets here for.
    (void)stream.synchronize();
    t.reason = lease.ok() ? "event record failed" : lease.status().describe();
    co_return TransferErrc::device_error;
  }
  t.state = TransferState::pending;
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
