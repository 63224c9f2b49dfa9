// What kvstrand-server keeps of its clients, on its strand: each client
// process (the owner of what its sessions hold, watched through its pidfd)
// and each connection (its framed connection, what the request service
// knows of it).
#pragma once

#include <sys/types.h>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <chrono>
#include <cstdint>
#include <memory>

#include "channel/framed_connection.hpp"
#include "common/strand.hpp"
#include "server/request_service.hpp"
#include "tier/index.hpp"

namespace kvstrand::server {

using common::Strand;
using Clock = std::chrono::steady_clock;

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
  explicit Session(std::uint64_t i) : id(i) {}
  std::uint64_t id;
  std::shared_ptr<channel::FramedConnection> conn;  // its replies go out here, the arena's fd with the hello's
  std::shared_ptr<Process> process;
  Client client;  // what the request service knows of it
  bool ended = false;
  Clock::time_point started = Clock::now();
  std::uint64_t requests = 0;
};

}  // namespace kvstrand::server
