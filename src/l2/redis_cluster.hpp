// A Redis Cluster client, or a single non-cluster Redis seen as a cluster of
// one node: the slot map from CLUSTER SLOTS, each command routed to the node
// of its key's slot (CRC16), MOVED and ASK followed, lost nodes reconnected,
// and every batch of commands pipelined per node and bounded in time as a
// whole. The only place in kvstrand that knows Redis.
//
// It lives on one strand: construct it, call it, and destroy it there
// (before the strand's io_context). Its coroutines complete with values
// (RedisResult), never exceptions.
#pragma once

#include "common/expected.hpp"
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "l2/redis_connection.hpp"
#include "l2/redis_value.hpp"
#include "common/strand.hpp"

namespace kvstrand::l2 {

struct RedisAddress {
  std::string host;
  int port = 0;
  std::string str() const { return host + ":" + std::to_string(port); }
  bool operator==(const RedisAddress&) const = default;
};

// "redis://HOST:PORT[,HOST:PORT...]": the seed nodes. None and a reason in
// `why` when the text is not that.
common::Expected<std::vector<RedisAddress>> parse_redis_url(std::string_view url);

struct RedisOptions {
  std::vector<RedisAddress> seeds;
  std::chrono::milliseconds timeout{100};  // one batch, redirections included
  std::size_t max_inflight = 1024;         // unanswered commands per node before `overloaded`
  std::chrono::milliseconds retry_after{100};  // between attempts to reach a node that failed
  RedisCredentials credentials;                 // sent on every connection made
};

struct RedisClusterStats {
  bool cluster = false;  // false: one non-cluster server
  std::uint64_t nodes = 0;
  std::uint64_t commands = 0;
  std::uint64_t moved = 0;
  std::uint64_t asked = 0;
  std::uint64_t timeouts = 0;     // commands unanswered at their batch's timeout
  std::uint64_t failed = 0;       // commands ended by another RedisErrc
  std::uint64_t refreshes = 0;    // slot maps learned
  std::uint64_t connects = 0;     // connections made (reconnects included)
};

class RedisCluster {
 public:
  RedisCluster(common::Strand strand, RedisOptions options);
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  // Refreshes of the slot map (started by MOVED) stop; one in flight is
  // waited for, at most `bound`. Commands are still answered until it is
  // destroyed.
  boost::asio::awaitable<void> close(std::chrono::milliseconds bound);

  // Learns the slot map from the first seed that answers within the
  // timeout; a seed with cluster support disabled is served alone. An error
  // when no seed answered.
  boost::asio::awaitable<std::error_code> start();
  // Why the last start() failed, for a person (never a password).
  std::string last_error() const;

  // Runs `commands` (each: name, key, arguments), each routed by its key,
  // pipelined per node; the results in the same order. The whole call ends
  // within the timeout: a command not answered by then is RedisErrc::timeout.
  boost::asio::awaitable<std::vector<RedisResult>> run(std::vector<std::vector<std::string>> commands);

  // GET of each key, pipelined: a string, nil (no such key), or no answer.
  boost::asio::awaitable<std::vector<RedisResult>> get(std::vector<std::string> keys);
  // SET of each (key, value), with an expiry when `ttl` > 0: "OK", or no answer.
  boost::asio::awaitable<std::vector<RedisResult>> set(std::vector<std::pair<std::string, std::string>> items,
                                                       std::chrono::seconds ttl);

  // Each command run on the node at its address ("host:port"), not routed
  // by a key (SCAN names none); the results in the same order, within the
  // timeout.
  boost::asio::awaitable<std::vector<RedisResult>> run_on(
      std::vector<std::pair<std::string, std::vector<std::string>>> commands);

  RedisClusterStats stats() const;
  // The node the slot map names for `key` now ("host:port"), or "".
  std::string node_of(std::string_view key) const;
  // The masters the slot map names now, each once ("host:port"); a seed
  // served alone (cluster support off) is its one master.
  std::vector<std::string> masters() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvstrand::l2
