// One Redis node: one hiredis async context whose socket is awaited on the
// strand with async_wait (no thread, no lock). Commands are pipelined: each
// is written behind the ones before it without waiting for their answers.
//
// Everything here runs on the strand. A connection that is lost, or cannot
// be made, fails its unanswered commands and is made again on the next send
// (not sooner than `retry_after` after a failed attempt).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/expected.hpp"
#include "l2/redis_value.hpp"
#include "common/strand.hpp"

struct redisAsyncContext;

namespace kvstrand::l2 {

// An ACL user and its password, sent as AUTH first on every connection
// made (no password: no AUTH; no user: Redis's default user). Never logged.
struct RedisCredentials {
  std::string username;
  std::string password;
};

class RedisConnection {
 public:
  using Done = std::function<void(RedisResult)>;

  RedisConnection(common::Strand strand, std::string host, int port, std::size_t max_inflight,
                  std::chrono::milliseconds retry_after = std::chrono::milliseconds(100),
                  RedisCredentials credentials = {});
  ~RedisConnection();  // unanswered commands complete with `disconnected`
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // `done` runs exactly once, posted to the strand (never inside send or a
  // hiredis callback): with the answer, or with a RedisErrc.
  void send(const std::vector<std::string>& argv, Done done);
  // ASKING, then the command, back to back on this connection (a slot being
  // imported here answers the command only right after ASKING).
  void send_asking(const std::vector<std::string>& argv, Done done);
  // Closes the connection now; unanswered commands complete `disconnected`.
  void drop();

  const std::string& host() const noexcept { return host_; }
  int port() const noexcept { return port_; }
  std::string address() const { return host_ + ":" + std::to_string(port_); }
  std::size_t inflight() const noexcept { return inflight_; }
  std::uint64_t connects() const noexcept { return connects_; }
  // Why the node refused the last AUTH (its error reply), or empty.
  const std::string& auth_error() const noexcept { return auth_error_; }

 private:
  struct Watch;
  struct Call;
  common::Expected<void> ensure_context();  // a connected (or connecting) context, or why not
  void submit(const std::vector<std::string>& argv, Done done, bool asking);
  void post(Done done, RedisResult r);
  static void on_reply(redisAsyncContext* ac, void* reply, void* privdata);
  static void on_connect(const redisAsyncContext* ac, int status);
  static void on_disconnect(const redisAsyncContext* ac, int status);
  void context_gone(const std::string& why);

  common::Strand strand_;
  std::string host_;
  int port_;
  std::size_t max_inflight_;
  std::chrono::milliseconds retry_after_;
  RedisCredentials credentials_;
  std::string auth_error_;
  redisAsyncContext* ac_ = nullptr;
  bool connected_ = false;  // the connect callback said ok
  std::shared_ptr<Watch> watch_;
  std::size_t inflight_ = 0;
  std::uint64_t connects_ = 0;
  std::chrono::steady_clock::time_point retry_at_{};
  std::string last_error_;
};

}  // namespace kvstrand::l2
