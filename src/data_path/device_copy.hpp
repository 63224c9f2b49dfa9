// The one copy of every transfer, in two steps (post, then check): post()
// queues a batch of segments on a stream and records a pooled event after
// it; wait() awaits that event on the poller.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <optional>
#include <span>
#include <vector>

#include "device/copy.hpp"
#include "device/event_pool.hpp"
#include "device/stream.hpp"
#include "index_plane/failure.hpp"
#include "reactor/reactor.hpp"

namespace kvstrand::data_path {

struct CopyEnd {
  index_plane::Failure failure;
  // False when the wait ended without the copy being known complete
  // (shutdown): the caller must then leave every buffer it references alone.
  bool seen = true;
};

class DeviceCopy {
 public:
  // On the strand. Queues the copy on `stream`. queued(): whether anything
  // was queued (false: it failed at once, and wait() says why).
  // `after`: an event of the caller's to record after the copy and await,
  // instead of one from the pool (a load's copies-queued event: one record
  // serves the engine's stream and the poller). No one may record it again
  // before wait() completed.
  static DeviceCopy post(reactor::Reactor& reactor, device::Stream& stream, device::CopyKind kind,
                         std::span<const device::Segment> segs, device::Event* after = nullptr);
  bool queued() const noexcept { return queued_; }
  // Whether `e` was recorded after the copy (the `after` given to post).
  bool recorded(const device::Event* e) const noexcept { return e != nullptr && lent_ == e; }
  device::Stream& stream() const noexcept { return *stream_; }
  // On the strand: completes once the copy is seen to end (or the wait is
  // cut short by shutdown: seen == false).
  boost::asio::awaitable<CopyEnd> wait();

 private:
  DeviceCopy(reactor::Reactor& r, device::Stream& s) : reactor_(&r), stream_(&s) {}
  reactor::Reactor* reactor_;
  device::Stream* stream_;
  bool queued_ = false;
  index_plane::Failure failure_;                // why it was not queued, or why it has no event
  std::optional<device::EventPool::Lease> event_;  // recorded after the copy
  device::Event* lent_ = nullptr;                   // or the caller's, recorded instead
};

}  // namespace kvstrand::data_path
