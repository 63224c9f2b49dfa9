// The completion token of every awaited Asio operation here: it completes
// with its error code in a tuple, never by a throw (under Boost 1.81,
// `a || timer` holds a's exception until the timer fires).
#pragma once

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace kvstrand::common {

inline const auto kAwait = boost::asio::as_tuple(boost::asio::use_awaitable);

}  // namespace kvstrand::common
