#include "data_path/device_copy.hpp"

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "common/load_trace.hpp"
#include "index_plane/transfer_error.hpp"

namespace kvstrand::data_path {

namespace asio = boost::asio;

DeviceCopy DeviceCopy::post(reactor::Reactor& reactor, device::Stream& stream, device::CopyKind kind,
                            std::span<const device::Segment> segs, device::Event* after) {
  const bool load = kind == device::CopyKind::host_to_device;
  if (load) common::LoadTrace::mark(common::LoadTrace::planned);
  DeviceCopy c(reactor, stream);
  if (device::Status s = device::copy_batch(stream, kind, segs); !s.ok()) {
    c.failure_ = index_plane::Failure{TransferErrc::device_error, s.describe()};
    return c;
  }
  if (load) common::LoadTrace::mark(common::LoadTrace::launched);
  c.queued_ = true;
  if (after != nullptr) {
    if (after->record(stream).ok()) c.lent_ = after;
    else
      c.failure_ = index_plane::Failure{TransferErrc::device_error, "event record failed"};
    if (load) common::LoadTrace::mark(common::LoadTrace::recorded);
    return c;
  }
  auto lease = reactor.events().acquire();
  if (!lease.ok()) {
    c.failure_ = index_plane::Failure{TransferErrc::device_error, lease.status().describe()};
  } else if (!lease->record(stream).ok()) {
    c.failure_ = index_plane::Failure{TransferErrc::device_error, "event record failed"};
  } else {
    c.event_.emplace(std::move(lease).value());
  }
  if (load) common::LoadTrace::mark(common::LoadTrace::recorded);
  return c;
}

asio::awaitable<CopyEnd> DeviceCopy::wait() {
  if (!queued_) co_return CopyEnd{failure_};
  const device::Event* event = lent_ != nullptr ? lent_ : event_ ? &event_->event() : nullptr;
  if (event == nullptr) {
    // The copy is queued but has no event to await (only a broken runtime
    // gets here). The strand never waits on the device: poll the stream
    // until it has drained instead, with the strand free in between; the
    // transfer's deadline still bounds what the engine waits.
    asio::steady_timer poll(reactor_->strand());
    for (;;) {
      const device::Status q = stream_->query();
      if (q.code() != device::Errc::not_ready) break;
      poll.expires_after(std::chrono::microseconds(200));
      boost::system::error_code ec;
      co_await poll.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      if (ec)  // shutdown: the copy may still be running
        co_return CopyEnd{index_plane::Failure{std::make_error_code(std::errc::operation_canceled), failure_.why},
                          false};
    }
    co_return CopyEnd{failure_};
  }
  std::error_code ec = co_await reactor_->poller().ready(*event);
  if (ec == std::errc::operation_canceled)  // shutdown: the copy may still be running
    co_return CopyEnd{index_plane::Failure{ec, "reactor shut down before the copy was seen complete"}, false};
  if (ec) co_return CopyEnd{index_plane::Failure{TransferErrc::device_error, "device: " + ec.message()}};
  co_return CopyEnd{};
}

}  // namespace kvstrand::data_path
