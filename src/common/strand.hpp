// The executor every kvstrand state machine runs on: one strand of one
// io_context. Its own header so that code with no device (kvstrand-server,
// the debug endpoint) names it without the device runtime.
#pragma once

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_future.hpp>

namespace kvstrand::common {

namespace asio = boost::asio;
using Strand = asio::strand<asio::io_context::executor_type>;

// Runs `make()`'s coroutine on `strand` and blocks the calling thread until
// it has finished: its value, or its exception rethrown here. Never from the
// strand's own thread (it would wait for itself): start-up, stop, and the
// engine's blocking calls.
template <class MakeAwaitable>
auto call_on(Strand& strand, MakeAwaitable make) {
  return asio::co_spawn(strand, make(), asio::use_future).get();
}

}  // namespace kvstrand::common
