#include "l2/redis_cluster.hpp"

#include "common/gate.hpp"

#include <arpa/inet.h>
#include <spdlog/spdlog.h>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/append.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <charconv>
#include <map>

#include "l2/key_slot.hpp"
#include "l2/redis_connection.hpp"

namespace kvstrand::l2 {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

namespace {

// After this many redirections of one command the slot map is wrong in a way
// one migration cannot explain (a MOVED loop).
constexpr std::uint8_t kMaxHops = 5;

bool parse_port(std::string_view s, int* port) {
  int p = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), p);
  if (ec != std::errc{} || end != s.data() + s.size() || p <= 0 || p > 65535) return false;
  *port = p;
  return true;
}

// "HOST:PORT", HOST a numeric IPv4 address.
std::optional<RedisAddress> parse_address(std::string_view s) {
  const auto colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  RedisAddress a;
  a.host = std::string(s.substr(0, colon));
  in_addr ignored{};
  if (::inet_pton(AF_INET, a.host.c_str(), &ignored) != 1) return std::nullopt;
  if (!parse_port(s.substr(colon + 1), &a.port)) return std::nullopt;
  return a;
}

}  // namespace

common::Expected<std::vector<RedisAddress>> parse_redis_url(std::string_view url) {
  constexpr std::string_view scheme = "redis://";
  if (!url.starts_with(scheme)) {
    return common::unexpected("'" + std::string(url) + "' does not start with redis://");
  }
  url.remove_prefix(scheme.size());
  std::vector<RedisAddress> out;
  while (!url.empty()) {
    const auto comma = url.find(',');
    const std::string_view one = url.substr(0, comma);
    auto a = parse_address(one);
    if (!a) {
      // A host name would be resolved synchronously, on the strand.
      return common::unexpected("'" + std::string(one) + "' is not IPV4:PORT (host names are not resolved)");
    }
    out.push_back(*a);
    if (comma == std::string_view::npos) break;
    url.remove_prefix(comma + 1);
    if (url.empty()) {
      return common::unexpected("a seed list ends with ','");
    }
  }
  if (out.empty()) {
    return common::unexpected("no seed node after redis://");
  }
  return out;
}

struct RedisCluster::Impl : std::enable_shared_from_this<RedisCluster::Impl> {
  using Handler = asio::any_completion_handler<void(std::vector<RedisResult>)>;

  struct Batch {
    explicit Batch(const common::Strand& s) : timer(s) {}
    std::vector<std::vector<std::string>> cmds;
    std::vector<int> direct;  // a node index, kByKey: routed by key, kNoSuchNode: answered no_node
    std::vector<RedisResult> results;
    std::vector<std::uint8_t> done, hops;
    std::vector<int> at;  // the node each command was last sent to
    std::size_t remaining = 0;
    asio::steady_timer timer;
    std::optional<Handler> handler;
  };

  static constexpr int kByKey = -1, kNoSuchNode = -2;

  Impl(common::Strand s, RedisOptions o) : strand(std::move(s)), opt(std::move(o)), slots(kSlots, -1) {}

  int node_index(const RedisAddress& a) {
    const std::string key = a.str();
    if (auto it = index.find(key); it != index.end()) return it->second;
    nodes.push_back(
        std::make_unique<RedisConnection>(strand, a.host, a.port, opt.max_inflight, opt.retry_after, opt.credentials));
    index[key] = static_cast<int>(nodes.size() - 1);
    return static_cast<int>(nodes.size() - 1);
  }

  void start_batch(std::vector<std::vector<std::string>> cmds, std::vector<int> direct, Handler h) {
    auto b = std::make_shared<Batch>(strand);
    b->cmds = std::move(cmds);
    b->direct = std::move(direct);
    b->direct.resize(b->cmds.size(), kByKey);
    b->results.resize(b->cmds.size());
    b->done.assign(b->cmds.size(), 0);
    b->hops.assign(b->cmds.size(), 0);
    b->at.assign(b->cmds.size(), -1);
    b->remaining = b->cmds.size();
    b->handler.emplace(std::move(h));
    stats.commands += b->cmds.size();
    if (closed) {
      for (std::size_t i = 0; i < b->cmds.size(); ++i) b->results[i].ec = RedisErrc::disconnected;
      b->remaining = 0;
    }
    if (b->remaining == 0) {
      complete(b);
      return;
    }
    b->timer.expires_after(opt.timeout);
    b->timer.async_wait([self = shared_from_this(), b](const boost::system::error_code& ec) {
      if (!ec) self->expire(b);
    });
    for (std::size_t i = 0; i < b->cmds.size(); ++i) {
      int node = b->direct[i];
      if (node == kByKey) node = b->cmds[i].size() >= 2 ? slots[key_slot(b->cmds[i][1])] : (nodes.empty() ? -1 : 0);
      if (node < 0) {
        RedisResult r;
        r.ec = RedisErrc::no_node;
        r.why = b->direct[i] == kNoSuchNode ? "not a node address (HOST:PORT)"
                                            : "no node known for slot " + std::to_string(key_slot(b->cmds[i][1]));
        finish_one(b, i, std::move(r));
        continue;
      }
      send(b, i, node, false);
    }
  }

  void send(const std::shared_ptr<Batch>& b, std::size_t i, int node, bool asking) {
    b->at[i] = node;
    auto done = [self = shared_from_this(), b, i, node](RedisResult r) { self->answered(b, i, node, std::move(r)); };
    if (asking) nodes[node]->send_asking(b->cmds[i], std::move(done));
    else nodes[node]->send(b->cmds[i], std::move(done));
  }

  void answered(const std::shared_ptr<Batch>& b, std::size_t i, int node, RedisResult r) {
    if (b->done[i]) return;  // its batch timed out: a late answer is dropped
    if (closed && !r.ec) {
      r.ec = RedisErrc::disconnected;
      r.why = "the client was closed";
    }
    if (r.ec) {
      if (r.ec == RedisErrc::unreachable || r.ec == RedisErrc::disconnected) request_refresh();
      finish_one(b, i, std::move(r));
      return;
    }
    const std::string& e = r.value.str;
    const bool moved = r.value.is_error() && e.starts_with("MOVED ");
    const bool ask = r.value.is_error() && e.starts_with("ASK ");
    if (moved || ask) {
      // "MOVED 3999 127.0.0.1:6381"
      const auto sp = e.find(' ', moved ? 6 : 4);
      int slot = -1;
      std::optional<RedisAddress> to;
      if (sp != std::string::npos) {
        const std::string_view num(e.data() + (moved ? 6 : 4), sp - (moved ? 6 : 4));
        std::from_chars(num.data(), num.data() + num.size(), slot);
        to = parse_address(std::string_view(e).substr(sp + 1));
      }
      if (!to || slot < 0 || slot >= kSlots) {
        r.value.str = "unreadable redirection from " + nodes[node]->address() + ": " + e;
        finish_one(b, i, std::move(r));
        return;
      }
      if (++b->hops[i] > kMaxHops) {
        RedisResult fail;
        fail.ec = RedisErrc::redirected_too_often;
        fail.why = "last: " + e;
        finish_one(b, i, std::move(fail));
        return;
      }
      const int target = node_index(*to);
      if (moved) {
        ++stats.moved;
        slots[slot] = target;
        request_refresh();
      } else {
        ++stats.asked;
      }
      send(b, i, target, ask);
      return;
    }
    finish_one(b, i, std::move(r));
  }

  void finish_one(const std::shared_ptr<Batch>& b, std::size_t i, RedisResult r) {
    if (r.ec) ++stats.failed;
    b->results[i] = std::move(r);
    b->done[i] = 1;
    if (--b->remaining == 0) complete(b);
  }

  void expire(const std::shared_ptr<Batch>& b) {
    for (std::size_t i = 0; i < b->cmds.size(); ++i) {
      if (b->done[i]) continue;
      b->done[i] = 1;
      ++stats.timeouts;
      b->results[i].ec = RedisErrc::timeout;
      b->results[i].why = "no answer within " + std::to_string(opt.timeout.count()) + " ms" +
                          (b->at[i] >= 0 && static_cast<std::size_t>(b->at[i]) < nodes.size()
                               ? " from " + nodes[b->at[i]]->address()
                               : std::string());
    }
    b->remaining = 0;
    complete(b);
  }

  void complete(const std::shared_ptr<Batch>& b) {
    if (!b->handler) return;
    b->timer.cancel();
    Handler h = std::move(*b->handler);
    b->handler.reset();
    asio::dispatch(asio::append(std::move(h), std::move(b->results)));
  }

  // One command to one node, bounded by the timeout.
  asio::awaitable<RedisResult> ask(int node, std::vector<std::string> cmd) {
    auto self = shared_from_this();
    auto init = [self, node, cmd = std::move(cmd)](auto handler) mutable {
      self->start_batch({std::move(cmd)}, {node}, Handler(std::move(handler)));
    };
    asio::use_awaitable_t<> token;
    std::vector<RedisResult> r =
        co_await asio::async_initiate<decltype(token), void(std::vector<RedisResult>)>(std::move(init), token);
    co_return std::move(r.front());
  }

  // CLUSTER SLOTS from `node`: true when the map was replaced.
  bool apply_slots(const RedisValue& v, int asked) {
    if (v.kind != RedisValue::Kind::array) return false;
    std::vector<int> map(kSlots, -1);
    for (const RedisValue& range : v.elements) {
      if (range.kind != RedisValue::Kind::array || range.elements.size() < 3) return false;
      const RedisValue& master = range.elements[2];
      if (master.kind != RedisValue::Kind::array || master.elements.size() < 2) return false;
      RedisAddress a{master.elements[0].str, static_cast<int>(master.elements[1].integer)};
      if (a.host.empty()) a.host = nodes[asked]->host();  // "the node you asked"
      const long long lo = range.elements[0].integer, hi = range.elements[1].integer;
      if (lo < 0 || hi >= kSlots || lo > hi) return false;
      const int n = node_index(a);
      for (long long s = lo; s <= hi; ++s) map[s] = n;
    }
    slots = std::move(map);
    ++stats.refreshes;
    return true;
  }

  // Asks each known node in turn for the slot map until one answers.
  asio::awaitable<std::error_code> learn(std::vector<int> candidates) {
    auto keep = shared_from_this();  // its RedisCluster may go while this waits
    std::string last = "no seed node";
    bool refused = false;
    for (int n : candidates) {
      // Built before the co_await (GCC 12, docs/development.md).
      std::vector<std::string> cmd = {"CLUSTER", "SLOTS"};
      RedisResult r = co_await ask(n, std::move(cmd));
      if (r.ec) {
        last = r.why.empty() ? r.ec.message() : r.why;
        continue;
      }
      if (r.value.is_error() && (r.value.str.starts_with("NOAUTH") || r.value.str.starts_with("WRONGPASS") ||
                                 r.value.str.starts_with("NOPERM"))) {
        // The credentials (none, wrong, or a user without the rights): the
        // AUTH's own answer says which, where one was sent.
        const std::string& auth = nodes[n]->auth_error();
        last = nodes[n]->address() + " refused the credentials: " + (auth.empty() ? r.value.str : auth);
        refused = true;
        continue;
      }
      if (r.value.is_error() && r.value.str.find("cluster support disabled") != std::string::npos) {
        cluster = false;
        slots.assign(kSlots, n);
        ++stats.refreshes;
        co_return std::error_code{};
      }
      if (apply_slots(r.value, n)) {
        cluster = true;
        last_refresh = Clock::now();  // a map just learned: the next refresh waits retry_after like any other
        co_return std::error_code{};
      }
      last = nodes[n]->address() + " answered CLUSTER SLOTS with something else: " + r.value.str;
    }
    // Quiet: the caller says it once (it retries every second).
    spdlog::debug("kvstrand l2: no Redis node gave a slot map: {}", last);
    last_error = last;
    co_return make_error_code(refused ? RedisErrc::auth_refused : RedisErrc::unreachable);
  }

  void request_refresh() {
    if (closed || !cluster || refreshing || Clock::now() - last_refresh < opt.retry_after) return;
    refreshing = true;
    last_refresh = Clock::now();
    std::vector<int> all;
    for (std::size_t k = 0; k < nodes.size(); ++k) all.push_back(static_cast<int>((k + next_ask) % nodes.size()));
    ++next_ask;
    auto self = shared_from_this();
    auto done = [self](std::exception_ptr e, std::error_code) {
      self->refreshing = false;
      if (e) spdlog::error("kvstrand l2: the slot map refresh threw");
    };
    if (!gate.spawn(learn(std::move(all)), std::move(done))) refreshing = false;  // closing
  }

  common::Strand strand;
  RedisOptions opt;
  std::vector<std::unique_ptr<RedisConnection>> nodes;
  std::map<std::string, int> index;
  std::vector<int> slots;  // slot -> node index, -1: none known
  bool cluster = false;
  bool refreshing = false;
  bool closed = false;  // the RedisCluster is gone: nothing new is sent
  Clock::time_point last_refresh{};
  std::string last_error;  // why the last start found no slot map
  std::size_t next_ask = 0;
  RedisClusterStats stats;
  common::Gate gate{strand};  // the slot map's refreshes run inside it
};

RedisCluster::RedisCluster(common::Strand strand, RedisOptions options)
    : impl_(std::make_shared<Impl>(std::move(strand), std::move(options))) {}

RedisCluster::~RedisCluster() {
  // Unanswered commands complete (posted) with `disconnected`.
  impl_->closed = true;
  impl_->nodes.clear();
}

asio::awaitable<std::error_code> RedisCluster::start() {
  std::vector<int> seeds;
  for (const RedisAddress& a : impl_->opt.seeds) seeds.push_back(impl_->node_index(a));
  co_return co_await impl_->learn(std::move(seeds));
}

asio::awaitable<void> RedisCluster::close(std::chrono::milliseconds bound) {
  auto impl = impl_;
  if (!co_await impl->gate.close(bound))
    spdlog::warn("kvstrand l2: a slot map refresh still running {} ms after close", bound.count());
}

std::string RedisCluster::last_error() const { return impl_->last_error; }

asio::awaitable<std::vector<RedisResult>> RedisCluster::run(std::vector<std::vector<std::string>> commands) {
  auto impl = impl_;
  // Built before the co_await (GCC 12, docs/development.md).
  auto init = [impl, c = std::move(commands)](auto handler) mutable {
    impl->start_batch(std::move(c), {}, Impl::Handler(std::move(handler)));
  };
  asio::use_awaitable_t<> token;
  co_return co_await asio::async_initiate<decltype(token), void(std::vector<RedisResult>)>(std::move(init), token);
}

asio::awaitable<std::vector<RedisResult>> RedisCluster::run_on(
    std::vector<std::pair<std::string, std::vector<std::string>>> commands) {
  auto impl = impl_;
  std::vector<std::vector<std::string>> cmds;
  std::vector<int> direct;
  for (auto& [address, cmd] : commands) {
    const auto a = parse_address(address);
    direct.push_back(a ? impl->node_index(*a) : Impl::kNoSuchNode);
    cmds.push_back(std::move(cmd));
  }
  // Built before the co_await (GCC 12, docs/development.md).
  auto init = [impl, c = std::move(cmds), d = std::move(direct)](auto handler) mutable {
    impl->start_batch(std::move(c), std::move(d), Impl::Handler(std::move(handler)));
  };
  asio::use_awaitable_t<> token;
  co_return co_await asio::async_initiate<decltype(token), void(std::vector<RedisResult>)>(std::move(init), token);
}

asio::awaitable<std::vector<RedisResult>> RedisCluster::get(std::vector<std::string> keys) {
  std::vector<std::vector<std::string>> cmds;
  cmds.reserve(keys.size());
  for (auto& k : keys) cmds.push_back({"GET", std::move(k)});
  co_return co_await run(std::move(cmds));
}

asio::awaitable<std::vector<RedisResult>> RedisCluster::set(std::vector<std::pair<std::string, std::string>> items,
                                                            std::chrono::seconds ttl) {
  std::vector<std::vector<std::string>> cmds;
  cmds.reserve(items.size());
  for (auto& [k, v] : items) {
    std::vector<std::string> c = {"SET", std::move(k), std::move(v)};
    if (ttl.count() > 0) {
      c.push_back("EX");
      c.push_back(std::to_string(ttl.count()));
    }
    cmds.push_back(std::move(c));
  }
  co_return co_await run(std::move(cmds));
}

RedisClusterStats RedisCluster::stats() const {
  RedisClusterStats s = impl_->stats;
  s.cluster = impl_->cluster;
  s.nodes = impl_->nodes.size();
  s.connects = 0;
  for (const auto& n : impl_->nodes) s.connects += n->connects();
  return s;
}

std::vector<std::string> RedisCluster::masters() const {
  std::vector<bool> seen(impl_->nodes.size(), false);
  std::vector<std::string> out;
  for (const int n : impl_->slots)
    if (n >= 0 && !seen[n]) {
      seen[n] = true;
      out.push_back(impl_->nodes[n]->address());
    }
  if (out.empty() && !impl_->cluster && !impl_->nodes.empty()) out.push_back(impl_->nodes[0]->address());
  return out;
}

std::string RedisCluster::node_of(std::string_view key) const {
  const int n = impl_->slots[key_slot(key)];
  return n < 0 ? std::string() : impl_->nodes[n]->address();
}

}  // namespace kvstrand::l2
