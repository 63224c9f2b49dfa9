// The L2's RedisCluster driven from a test's thread: it lives on a strand
// of its own reactor thread, as in the server, and each call waits for its
// result.
#pragma once

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_future.hpp>
#include <future>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "l2/redis_cluster.hpp"

namespace kvstrand::test {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using Commands = std::vector<std::vector<std::string>>;

// A RedisCluster on a strand of its own reactor thread, as the server has it.
class RedisTestClient {
 public:
  explicit RedisTestClient(const std::string& url, std::chrono::milliseconds timeout = 500ms,
                           std::chrono::milliseconds retry_after = l2::RedisOptions{}.retry_after,
                           std::size_t max_inflight = l2::RedisOptions{}.max_inflight,
                           l2::RedisCredentials credentials = {}) {
    auto seeds = l2::parse_redis_url(url);
    if (!seeds) throw std::runtime_error(seeds.why());
    l2::RedisOptions o;
    o.seeds = *seeds;
    o.timeout = timeout;
    o.retry_after = retry_after;
    o.max_inflight = max_inflight;
    o.credentials = std::move(credentials);
    thread_ = std::thread([this] { io_.run(); });
    on_strand([&] { cluster_.emplace(strand_, o); });
  }
  ~RedisTestClient() {
    on_strand([&] { cluster_.reset(); });
    guard_.reset();
    io_.stop();
    thread_.join();
  }

  std::error_code start() {
    return asio::co_spawn(strand_, cluster_->start(), asio::use_future).get();
  }
  std::vector<l2::RedisResult> run(Commands c) {
    return asio::co_spawn(strand_, cluster_->run(std::move(c)), asio::use_future).get();
  }
  std::vector<l2::RedisResult> run_on(std::vector<std::pair<std::string, Commands::value_type>> c) {
    return asio::co_spawn(strand_, cluster_->run_on(std::move(c)), asio::use_future).get();
  }
  std::vector<std::string> masters() {
    std::vector<std::string> m;
    on_strand([&] { m = cluster_->masters(); });
    return m;
  }
  l2::RedisClusterStats stats() {
    l2::RedisClusterStats s;
    on_strand([&] { s = cluster_->stats(); });
    return s;
  }
  std::string node_of(const std::string& key) {
    std::string s;
    on_strand([&] { s = cluster_->node_of(key); });
    return s;
  }

 private:
  template <class F>
  void on_strand(F f) {
    std::promise<void> done;
    asio::dispatch(strand_, [&] {
      f();
      done.set_value();
    });
    done.get_future().get();
  }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> guard_ = asio::make_work_guard(io_);
  common::Strand strand_ = asio::make_strand(io_);
  std::optional<l2::RedisCluster> cluster_;
  std::thread thread_;
};

}  // namespace kvstrand::test
