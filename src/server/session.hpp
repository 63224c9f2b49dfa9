// What kvstrand-server keeps of its clients, on its strand: each client
// process (the owner of what its sessions hold, watched through its pidfd)
// and each connection (its socket, the replies queued for it, what the
// request service knows of it).
#pragma once

#include <sys/types.h>

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "common/strand.hpp"
#include "server/request_service.hpp"
#include "tier/index.hpp"

namespace kvstrand::server {

using common::Strand;
using Clock = std::chrono::steady_clock;

// A reply on its way to a client.
struct Frame {
  std::vector<std::byte> bytes;
  bool with_arena_fd = false;  // the hello reply: the arena's fd goes with its first byte
};

// A client process: what its sessions hold is its own (an Index owner).
// Watched through its pidfd; it ends when the process has exited.
struct Process {
  Process(tier::Owner o, pid_t p, int pidfd, Strand& s) : owner(o), pid(p), watch(s, pidfd) {}
  tier::Owner owner;
  pid_t pid;
  boost::asio::posix::stream_descriptor watch;
  std::size_t sessions = 0;
};

struct Session {
  Session(std::uint64_t i, boost::asio::local::stream_protocol::socket s, Strand& strand) : id(i), sock(std::move(s)), drained(strand) {}
  std::uint64_t id;
  boost::asio::local::stream_protocol::socket sock;
  std::shared_ptr<Process> process;
  Client client;  // what the request service knows of it
  bool closed = false;
  bool close_after_flush = false;
  bool writing = false;
  std::deque<Frame> outbox;
  std::uint64_t queued_bytes = 0;
  boost::asio::steady_timer drained;  // cancelled by the writer as the queue shrinks
  Clock::time_point started = Clock::now();
  std::uint64_t requests = 0;
};

}  // namespace kvstrand::server
