// The executor every kvstrand state machine runs on: one strand of one
// io_context. Its own header so that code with no device (kvstrand-server,
// the debug endpoint) names it without the device runtime.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>

namespace kvstrand::common {

namespace asio = boost::asio;
using Strand = asio::strand<asio::io_context::executor_type>;

}  // namespace kvstrand::common
