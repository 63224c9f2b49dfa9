// The one copy path of every tier: queue a batch of segments on a stream,
// record a pooled event after it, and await the event on the poller.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <functional>
#include <vector>

#include "hip/copy.hpp"
#include "hip/stream.hpp"
#include "reactor/failure.hpp"
#include "reactor/reactor.hpp"

namespace kvstrand::reactor {

struct CopyEnd {
  Failure failure;
  // False when the wait ended without the copy being known complete
  // (shutdown): the caller must then leave every buffer it references alone.
  bool seen = true;
};

// On the strand. Calls `queued(stream)` once the copy is queued.
boost::asio::awaitable<CopyEnd> copy_and_wait(Reactor& reactor, hip::Stream& stream, hip::CopyKind kind,
                                              std::vector<hip::Segment> segs,
                                              const std::function<void(hip::Stream&)>& queued);

}  // namespace kvstrand::reactor
