// Real redis-server processes on free loopback ports for the L2 tests: one
// standalone server, or a cluster of masters joined by
// `redis-cli --cluster create`. Killed and their files removed at the end.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "process.hpp"

namespace kvstrand::test {

// The L2 tests start Debian's redis-server and redis-cli; a machine
// without them (the GPU hosts) skips those cases, saying so.
inline bool redis_present() {
  if (std::filesystem::exists("/usr/bin/redis-server") && std::filesystem::exists("/usr/bin/redis-cli")) return true;
  WARN("skipped: /usr/bin/redis-server or redis-cli missing (scripts/bootstrap.sh installs them)");
  return false;
}

inline bool port_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

class RedisNodes {
 public:
  // `masters` servers; a cluster when `cluster`, else each one standalone.
  // With a `password`, each requires it (requirepass, and masterauth).
  RedisNodes(int masters, bool cluster, std::string password = {}) : cluster_(cluster), password_(std::move(password)) {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvstrand-redis-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    std::filesystem::create_directories(dir_);
    std::mt19937 rng(std::random_device{}());
    for (int i = 0; i < masters; ++i) {
      int port = 0;
      for (int tries = 0; tries < 200 && port == 0; ++tries) {
        const int p = 20000 + static_cast<int>(rng() % 30000);  // the cluster bus is port + 10000
        if (port_free(p) && port_free(p + 10000)) port = p;
      }
      if (port == 0) throw std::runtime_error("RedisNodes: no free port pair");
      ports_.push_back(port);
      start(i);
    }
    if (cluster) {
      std::vector<std::string> args = {"/usr/bin/redis-cli", "--cluster", "create"};
      for (int p : ports_) args.push_back("127.0.0.1:" + std::to_string(p));
      for (const char* a : {"--cluster-replicas", "0", "--cluster-yes"}) args.push_back(a);
      add_auth(args);
      const ProcessResult r = run_process(args);
      if (r.exit_code != 0) throw std::runtime_error("redis-cli --cluster create failed:\n" + r.output);
      for (int i = 0; i < masters; ++i) wait_cluster_ok(i);
    }
  }
  ~RedisNodes() {
    servers_.clear();  // SIGKILL and reap
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  int port(int i) const { return ports_.at(i); }
  std::size_t size() const { return ports_.size(); }
  std::string url() const {
    std::string u = "redis://";
    for (std::size_t i = 0; i < ports_.size(); ++i) u += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(ports_[i]);
    return u;
  }
  pid_t pid(int i) const { return servers_.at(i)->pid(); }
  void signal(int i, int sig) { servers_.at(i)->signal(sig); }
  void kill(int i) {
    servers_.at(i).reset();  // SIGKILL, reaped
  }
  // Starts node i again on its port; a cluster node rejoins with its identity
  // and slots (its nodes.conf survives), its data gone (no persistence).
  void restart(int i) {
    servers_.at(i).reset();
    start(i);
    if (cluster_)
      for (std::size_t n = 0; n < ports_.size(); ++n)
        if (servers_[n]) wait_cluster_ok(static_cast<int>(n));
  }

  // redis-cli against node i; its output.
  std::string cli(int i, const std::vector<std::string>& args) const {
    std::vector<std::string> a = {"/usr/bin/redis-cli", "-p", std::to_string(ports_.at(i))};
    add_auth(a);
    a.insert(a.end(), args.begin(), args.end());
    const ProcessResult r = run_process(a);
    if (r.exit_code != 0) throw std::runtime_error("redis-cli " + args.front() + " failed: " + r.output);
    std::string out = r.output;
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return out;
  }
  std::string node_id(int i) const { return cli(i, {"CLUSTER", "MYID"}); }
  // The index of the node listening on `address` ("127.0.0.1:PORT"), or -1.
  int index_of(const std::string& address) const {
    for (std::size_t i = 0; i < ports_.size(); ++i)
      if (address == "127.0.0.1:" + std::to_string(ports_[i])) return static_cast<int>(i);
    return -1;
  }

  void wait_cluster_ok(int i) const {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (cli(i, {"CLUSTER", "INFO"}).find("cluster_state:ok") == std::string::npos) {
      if (std::chrono::steady_clock::now() > end) throw std::runtime_error("redis cluster not ok within 30 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

 private:
  void add_auth(std::vector<std::string>& args) const {
    if (password_.empty()) return;
    for (const std::string& a : {std::string("-a"), password_, std::string("--no-auth-warning")}) args.push_back(a);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }

  void start(int i) {
    const std::string p = std::to_string(ports_[i]);
    std::vector<std::string> args = {"/usr/bin/redis-server", "--port", p, "--bind", "127.0.0.1", "--save", "",
                                     "--appendonly", "no", "--dir", dir_.string(), "--logfile",
                                     (dir_ / ("redis-" + p + ".log")).string(), "--daemonize", "no"};
    if (cluster_) {
      for (const std::string& a : {std::string("--cluster-enabled"), std::string("yes"),
                                   std::string("--cluster-config-file"), "nodes-" + p + ".conf",
                                   std::string("--cluster-node-timeout"), std::string("5000"),
                                   // The other masters keep serving their slots when one is down.
                                   std::string("--cluster-require-full-coverage"), std::string("no")})
        args.push_back(a);
    }
    if (!password_.empty())
      for (const std::string& a : {std::string("--requirepass"), password_, std::string("--masterauth"), password_})
        args.push_back(a);
    if (servers_.size() <= static_cast<std::size_t>(i)) servers_.resize(i + 1);
    servers_[i] = std::make_unique<ChildProcess>(args);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
      std::vector<std::string> ping = {"/usr/bin/redis-cli", "-p", p};
      add_auth(ping);
      ping.push_back("PING");
      const ProcessResult r = run_process(ping);
      if (r.output.find("PONG") != std::string::npos) return;
      if (std::chrono::steady_clock::now() > end) throw std::runtime_error("redis-server on " + p + " did not start");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  bool cluster_;
  std::string password_;
  std::filesystem::path dir_;
  std::vector<int> ports_;
  std::vector<std::unique_ptr<ChildProcess>> servers_;
};

}  // namespace kvstrand::test
