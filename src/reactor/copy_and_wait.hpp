// The one copy path of every tier: queue a batch of segments on a stream,
// record a pooled event after it, and await the event on the poller.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <system_error>
#include <vector>

#include "hip/copy.hpp"
#include "hip/stream.hpp"
#include "reactor/reactor.hpp"
#include "reactor/transfer.hpp"

namespace kvstrand::reactor {

// On the strand. Marks `t` pending once the copy is queued. `copied` is
// false when the wait ended without the copy being known complete
// (shutdown): the caller must then leave every buffer it references alone.
boost::asio::awaitable<std::error_code> copy_and_wait(Reactor& reactor, Transfer& t, hip::Stream& stream,
                                                      hip::CopyKind kind, std::vector<hip::Segment> segs,
                                                      bool* copied);

}  // namespace kvstrand::reactor
