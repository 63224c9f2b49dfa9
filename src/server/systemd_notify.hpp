// Readiness for a supervisor: systemd's notify protocol (a unit of
// Type=notify) spoken directly, a datagram to $NOTIFY_SOCKET, so the server
// needs no libsystemd. Without $NOTIFY_SOCKET nothing is sent.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <string>

namespace kvstrand::server {

// Sends `state` (e.g. "READY=1\nSTATUS=serving") to $NOTIFY_SOCKET (a path,
// or '@' for the abstract namespace). True when sent; false when there is
// no such socket or it cannot be reached (said at debug: a supervisor that
// asked for notification and cannot be told times the unit out itself).
bool notify_supervisor(const std::string& state);

// The interval a supervisor's watchdog asks to be told "WATCHDOG=1" at
// ($WATCHDOG_USEC, for this process when $WATCHDOG_PID says which): half
// its timeout. Zero when no watchdog is asked for.
std::chrono::microseconds watchdog_interval();

// Says "WATCHDOG=1" now and every `every` after, on `timer`'s executor (the
// server's strand, so that a strand that stopped turning goes untold),
// until `timer` is cancelled.
boost::asio::awaitable<void> feed_watchdog(boost::asio::steady_timer& timer, std::chrono::microseconds every);

}  // namespace kvstrand::server
