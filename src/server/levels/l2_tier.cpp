#include "server/levels/l2_tier.hpp"
#include "server/levels/write_behind.hpp"
#include "common/await_codes.hpp"

#include <spdlog/spdlog.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <algorithm>
#include <set>
#include <cstring>
#include <deque>
#include <limits>

#include "l2/chunk_value.hpp"
#include "common/gate.hpp"
#include "server/events/kv_event_codec.hpp"
#include "server/events/tier_events.hpp"
#include "common/log_escaped.hpp"
#include "common/notifier.hpp"
#include "tier/arena.hpp"

namespace kvstrand::server {

namespace asio = boost::asio;

namespace {
// The index owner of what the server promotes: no client process.
constexpr tier::Owner kL2Owner = std::numeric_limits<tier::Owner>::max();
// Objects per pipelined SET batch.
constexpr std::size_t kWriteBatch = 16;
// Namespaces this server remembers having marked in Redis (forgotten all at
// once past it: marking again is one idempotent SET).
constexpr std::size_t kMarkedNamespaces = 1 << 16;
// A purge that could not finish is tried again after this long, doubling.
constexpr std::chrono::seconds kFirstPurgeRetry{1}, kMaxPurgeRetry{30};

// Says "some node wrote values of this namespace": set (never expiring,
// never deleted) before any value of it is written, so that a drop of a
// namespace no node ever wrote to L2 costs one read, not a scan of every
// master's keyspace.
std::string marker_of(const kv::Digest& ns) { return "kvstrand:v1:ns:" + kv::to_hex(ns); }
}  // namespace

struct L2Tier::Impl : std::enable_shared_from_this<L2Tier::Impl> {
  Impl(common::Strand s, L2Options o, std::byte* a, tier::SizeClasses& c)
      : strand(s), opt(std::move(o)), arena(a), classes(c) {
    l2::RedisOptions r;
    r.seeds = opt.seeds;
    r.timeout = opt.timeout;
    r.max_inflight = opt.max_inflight;
    r.credentials = opt.credentials;
    cluster.emplace(strand, std::move(r));
  }

  std::byte* object_at(const tier::Index& idx, std::uint32_t slot) const {
    return arena + classes.offset_of(idx, slot);
  }

  asio::awaitable<void> connect() {
    auto keep = shared_from_this();
    bool warned = false, refused = false;
    while (!stopped) {
      const std::error_code ec = co_await cluster->start();
      if (stopped) co_return;  // stop() closed the client meanwhile
      if (!ec) {
        const auto redis = cluster->stats();
        spdlog::info("kvstrand-server: L2 on {} Redis node(s){}, values {}", redis.nodes, redis.cluster ? " (cluster)" : "",
                     opt.mac ? "MACed (GMAC, a key per value)" : "checksummed (XXH3; no MAC key)");
        ready = true;
        st.auth_refused = false;  // let in after all (the operator fixed Redis's ACL)
        co_return;
      }
      if (ec == l2::RedisErrc::auth_refused && !refused) {
        // A configuration error, not an outage: said once, loudly.
        spdlog::error("kvstrand-server: L2: {} Give a Redis ACL user and its password with --l2-user and "
                      "--l2-password-file (or KVSTRAND_L2_PASSWORD); serving without L2, retrying",
                      cluster->last_error());
        refused = true;
        warned = true;
      }
      if (!warned)
        spdlog::warn("kvstrand-server: no L2 Redis node answers yet ({}); serving without L2, retrying",
                     cluster->last_error());
      warned = true;
      st.auth_refused = ec == l2::RedisErrc::auth_refused;
      // On `wake` (the writer starts only once connected): close() notifies it.
      co_await wake.wait_for(std::chrono::seconds(1));
    }
  }

  asio::awaitable<void> write_loop() {
    auto keep = shared_from_this();
    while (!stopped) {
      if (queue.empty() || !ready) {
        co_await wake.wait_for(queue.empty() ? std::chrono::milliseconds(std::chrono::hours(1))
                                             : std::chrono::milliseconds(100));
        continue;
      }
      // The namespaces of the next batch marked first: a value is never in
      // Redis before its namespace's marker.
      {
        std::vector<kv::Digest> unmarked;
        for (std::size_t i = 0; i < queue.size() && i < kWriteBatch; ++i) {
          const kv::Digest& ns = queue.items()[i].key.ns;
          if (!marked.contains(ns) && std::find(unmarked.begin(), unmarked.end(), ns) == unmarked.end())
            unmarked.push_back(ns);
        }
        if (!unmarked.empty()) {
          std::vector<std::vector<std::string>> sets;
          for (const kv::Digest& ns : unmarked) sets.push_back({"SET", marker_of(ns), "1"});
          std::vector<l2::RedisResult> r = co_await cluster->run(std::move(sets));
          if (marked.size() + unmarked.size() > kMarkedNamespaces) marked.clear();
          for (std::size_t i = 0; i < unmarked.size(); ++i)
            if (i < r.size() && r[i].answered() && r[i].value.kind == l2::RedisValue::Kind::status)
              marked.insert(unmarked[i]);
        }
      }
      std::vector<std::pair<std::string, std::string>> items;
      std::vector<bool> is_value;  // by item: an object's value (counted), or its description
      while (!queue.empty() && is_value.size() < kWriteBatch) {
        const WriteBehind::Item q = queue.take();
        if (!marked.contains(q.key.ns)) {  // its marker could not be set: not written (a later save writes it)
          queue.done(q);
          ++st.write_failed;
          continue;
        }
        const std::uint64_t object_bytes = q.index->object_bytes();
        items.emplace_back(l2::redis_key_of(q.key),
                           l2::encode_chunk_value(q.key, q.image, {object_at(*q.index, q.slot), object_bytes},
                                                  opt.mac ? &*opt.mac : nullptr));
        is_value.push_back(true);
        if (events != nullptr)
          if (std::string_view d = events->text(q.description); !d.empty()) {
            items.emplace_back(l2::redis_description_key_of(q.key), std::string(d));
            is_value.push_back(false);
          }
        queue.done(q);  // its bytes are taken
      }
      if (items.empty()) continue;
      in_flight = static_cast<std::size_t>(std::count(is_value.begin(), is_value.end(), true));
      std::vector<l2::RedisResult> r = co_await cluster->set(std::move(items), opt.ttl);
      in_flight = 0;
      settled.notify();  // drain() looks again
      for (std::size_t i = 0; i < r.size(); ++i) {
        const l2::RedisResult& x = r[i];
        if (i < is_value.size() && !is_value[i]) continue;  // a description: its value says how the write went
        if (x.answered() && x.value.kind == l2::RedisValue::Kind::status) {
          ++st.written;
        } else {
          ++st.write_failed;
          spdlog::debug("kvstrand-server: an L2 write failed: {}", x.answered() ? x.value.str : x.why);
        }
      }
    }
  }

  void committed(tier::Index& idx, std::span<const std::uint32_t> slots) {
    for (std::uint32_t slot : slots) {
      const DescriptionPool::Id whole = events ? events->hold_whole(idx, slot) : DescriptionPool::kNone;
      if (queue.push(idx, slot, whole) == WriteBehind::Push::full) ++st.write_dropped;
    }
    wake.notify();
  }

  // A value that will never load is deleted, so that it is not fetched and
  // refused on every lookup that reaches it. (A writer's good value set just
  // before the DEL is lost with it: a later miss, rewritten at its next save.)
  void forget(std::string name) {
    auto del = [](std::shared_ptr<Impl> self, std::string name) -> asio::awaitable<void> {
      std::vector<std::vector<std::string>> cmd{{"DEL", std::move(name)}};
      std::vector<l2::RedisResult> r = co_await self->cluster->run(std::move(cmd));
      if (!r.empty() && r[0].answered() && !r[0].value.is_error()) ++self->st.bad_values_deleted;
    };
    gate.spawn(del(shared_from_this(), std::move(name)), common::LogEscaped{"an L2 DEL"});
  }

  std::size_t drop(const kv::Digest& ns) {
    dropped.insert(ns);
    queue.drop_namespace(ns);
    // Queued, one purge at a time: a burst of drops never floods Redis, and
    // a purge that fails is tried again until it ends (the namespace is not
    // promoted meanwhile).
    if (std::find(purges.begin(), purges.end(), ns) == purges.end()) purges.push_back(ns);
    if (!purging && !stopped) {
      purging = true;
      gate.spawn(purge_loop(shared_from_this()), common::LogEscaped{"the L2 purges"});
    }
    purge_wake.notify();
    return 0;
  }

  static asio::awaitable<void> purge_loop(std::shared_ptr<Impl> self) {
    struct Ended {
      bool& purging;
      ~Ended() { purging = false; }
    } ended{self->purging};
    std::chrono::seconds retry = kFirstPurgeRetry;
    while (!self->stopped && !self->purges.empty()) {
      if (!self->ready) {  // Redis not there yet: looked at again shortly (connect() cancels nothing here)
        co_await self->purge_wake.wait_for(std::chrono::milliseconds(200));
        continue;
      }
      const kv::Digest ns = self->purges.front();
      if (co_await purge(self, ns)) {
        self->purges.pop_front();
        self->dropped.erase(ns);
        retry = kFirstPurgeRetry;
        continue;
      }
      if (self->stopped) break;
      // Tried again later, behind the others (one that cannot end holds none back).
      self->purges.pop_front();
      self->purges.push_back(ns);
      co_await self->purge_wake.wait_for(retry);
      retry = std::min(retry * 2, kMaxPurgeRetry);
    }
  }

  // Deletes the namespace's values from every master: SCAN for its keys,
  // UNLINK what it finds, until each master's cursor comes back to 0. True
  // once every master was scanned to its end (or no node ever wrote the
  // namespace: no marker), and only then is it promoted again: a value left
  // behind (a master that did not answer) is never read.
  static asio::awaitable<bool> purge(std::shared_ptr<Impl> self, kv::Digest ns) {
    {
      std::vector<std::vector<std::string>> exists{{"EXISTS", marker_of(ns)}};
      std::vector<l2::RedisResult> r = co_await self->cluster->run(std::move(exists));
      if (r.empty() || !r[0].answered() || r[0].value.kind != l2::RedisValue::Kind::integer) {
        ++self->st.purge_failed;
        co_return false;
      }
      if (r[0].value.integer == 0) {
        ++self->st.purges_skipped;
        co_return true;
      }
    }
    const std::string pattern = "kvstrand:v1:*:" + kv::to_hex(ns) + ":*";  // l2::redis_key_of's form
    const std::vector<std::string> masters = self->cluster->masters();
    std::vector<std::string> cursor(masters.size(), "0");
    std::vector<bool> done(masters.size(), false);
    bool whole = !masters.empty();
    for (;;) {
      std::vector<std::pair<std::string, std::vector<std::string>>> scans;
      std::vector<std::size_t> which;
      for (std::size_t m = 0; m < masters.size(); ++m)
        if (!done[m]) {
          scans.push_back({masters[m], {"SCAN", cursor[m], "MATCH", pattern, "COUNT", "1000"}});
          which.push_back(m);
        }
      if (scans.empty() || self->stopped) break;
      std::vector<l2::RedisResult> got = co_await self->cluster->run_on(std::move(scans));
      std::vector<std::vector<std::string>> unlinks;
      for (std::size_t k = 0; k < got.size(); ++k) {
        const std::size_t m = which[k];
        const l2::RedisValue& v = got[k].value;
        if (!got[k].answered() || v.kind != l2::RedisValue::Kind::array || v.elements.size() != 2) {
          done[m] = true;  // this master's values stay, unread here
          whole = false;
          ++self->st.purge_failed;
          continue;
        }
        cursor[m] = v.elements[0].str;
        for (const l2::RedisValue& key : v.elements[1].elements) unlinks.push_back({"UNLINK", key.str});
        if (cursor[m] == "0") done[m] = true;
      }
      if (unlinks.empty()) continue;
      std::vector<l2::RedisResult> unlinked = co_await self->cluster->run(std::move(unlinks));
      for (const l2::RedisResult& r : unlinked)
        if (r.answered() && r.value.kind == l2::RedisValue::Kind::integer)
          self->st.purged += static_cast<std::uint64_t>(r.value.integer);
    }
    co_return whole && !self->stopped;
  }

  asio::awaitable<Promoted> promote(tier::Index& idx, std::vector<kv::ChunkKey> keys, tier::TenantId tenant) {
    auto keep = shared_from_this();
    // A lookup's keys are one registration's: one namespace.
    if (!ready || stopped || keys.empty() || dropped.contains(keys.front().ns)) co_return Promoted{};
    ++st.lookups;
    std::vector<std::string> names;
    names.reserve(keys.size() * 2);
    for (const kv::ChunkKey& k : keys) names.push_back(l2::redis_key_of(k));
    // With events, each value's description too (after every value).
    TierEvents* const described = events;
    if (described != nullptr)
      for (const kv::ChunkKey& k : keys) names.push_back(l2::redis_description_key_of(k));
    std::vector<l2::RedisResult> got = co_await cluster->get(std::move(names));
    std::vector<l2::RedisResult> descriptions;
    if (described != nullptr && got.size() > keys.size()) {
      descriptions.assign(std::make_move_iterator(got.begin() + static_cast<std::ptrdiff_t>(keys.size())),
                          std::make_move_iterator(got.end()));
      got.resize(keys.size());
    }
    const std::uint64_t object_bytes = idx.object_bytes();
    std::vector<l2::ChunkValue> found;
    LevelMiss why = LevelMiss::none;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const l2::RedisResult& r = got[i];
      if (!r.answered()) {
        ++st.unanswered;
        why = LevelMiss::timeout;
        break;
      }
      if (r.value.kind == l2::RedisValue::Kind::nil) break;
      if (r.value.kind != l2::RedisValue::Kind::string) {
        // Redis said no (CLUSTERDOWN while a master rejoins, WRONGTYPE, ...):
        // an error, not a value anyone stored.
        ++st.error_replies;
        why = LevelMiss::timeout;  // a node that cannot answer now (CLUSTERDOWN while a master rejoins)
        spdlog::debug("kvstrand-server: L2 GET of {}: {}", l2::redis_key_of(keys[i]),
                      r.value.is_error() ? r.value.str : std::string("a reply that is not a string"));
        break;
      }
      l2::Refusal refusal = l2::Refusal::corrupt;
      common::Expected<l2::ChunkValue> v =
          l2::decode_chunk_value(r.value.str, keys[i], object_bytes, opt.mac ? &*opt.mac : nullptr, &refusal);
      if (!v && refusal == l2::Refusal::unauthenticated) {
        // Left in Redis: another deployment's (another key, or none) as likely
        // as a forgery, and a writer that can forge can delete anyway.
        ++st.unauthenticated;
        why = LevelMiss::refused_value;
        spdlog::warn("kvstrand-server: L2 value of {} refused: {}", l2::redis_key_of(keys[i]), v.why());
        break;
      }
      if (!v) {
        ++st.bad_values;
        why = LevelMiss::refused_value;
        spdlog::warn("kvstrand-server: L2 value of {} refused and deleted: {}", l2::redis_key_of(keys[i]), v.why());
        forget(l2::redis_key_of(keys[i]));
        break;
      }
      found.push_back(*v);
    }
    if (found.empty()) {
      ++st.lookup_misses;
      co_return Promoted{0, why};
    }
    const std::size_t n = found.size();
    std::unique_ptr<bool[]> images(new bool[n]);
    for (std::size_t i = 0; i < n; ++i) images[i] = found[i].has_image;
    classes.make_room(idx, n);
    tier::Index::Reservation res =
        idx.reserve(std::span<const kv::ChunkKey>(keys.data(), n), std::span<const bool>(images.get(), n), kL2Owner,
                    tenant);
    std::size_t stored = 0;
    for (std::size_t i = 0; i < n; ++i) {
      if (res.chunks[i] == tier::Index::Chunk::full) break;
      if (res.chunks[i] == tier::Index::Chunk::reserved) {
        std::memcpy(object_at(idx, res.slots[i]), found[i].object.data(), object_bytes);
        ++st.promoted;
        if (i < descriptions.size()) describe(idx, res.slots[i], descriptions[i]);
      }
      ++stored;
    }
    if (res.id != 0) {
      std::vector<std::uint32_t> slots;
      if (events != nullptr)
        for (std::size_t i = 0; i < stored; ++i)
          if (res.chunks[i] == tier::Index::Chunk::reserved) slots.push_back(res.slots[i]);
      idx.commit(res.id, true);
      // Announced: each keeps BlockRemoved's part alone (Redis keeps the whole).
      if (events != nullptr) events->keep_removal_only(idx, slots);
    }
    co_return Promoted{stored, why};
  }

  // A promoted object's description, from Redis: announced at its commit
  // like any other, unless it is not one vLLM's consumers could read.
  void describe(const tier::Index& idx, std::uint32_t slot, const l2::RedisResult& r) {
    if (events == nullptr || !r.answered() || r.value.kind != l2::RedisValue::Kind::string) return;
    if (auto why = description_problem(r.value.str)) {
      events->count_refused();
      spdlog::debug("kvstrand-server: an L2 description refused: {}", *why);
      return;
    }
    events->describe(idx, slot, r.value.str);
  }

  common::Strand strand;
  L2Options opt;
  std::byte* arena;
  TierEvents* events = nullptr;  // --events
  tier::SizeClasses& classes;
  std::optional<l2::RedisCluster> cluster;
  WriteBehind queue{opt.max_inflight, UINT64_MAX};  // each read-locked in the arena until its value is encoded
  std::set<kv::Digest> dropped;  // namespaces dropped here, not promoted until purged from every master
  std::deque<kv::Digest> purges;  // namespaces still to purge, the next first
  bool purging = false;           // purge_loop runs
  common::Notifier purge_wake{strand};  // purge_loop's wait: Redis to come, or a retry's back-off
  std::set<kv::Digest> marked;    // namespaces whose marker this server set (marker_of)
  common::Notifier wake{strand};  // the writer's sleep while the queue is empty
  common::Notifier settled{strand};  // notified as each SET batch is answered (drain's wait)
  common::Gate gate{strand};  // the connect loop and the writer run inside it
  std::size_t in_flight = 0;  // objects of the SET batch awaited now
  bool ready = false;
  bool stopped = false;
  L2Stats st;
};

L2Tier::L2Tier(common::Strand strand, L2Options options, std::byte* arena, tier::SizeClasses& classes)
    : impl_(std::make_shared<Impl>(std::move(strand), std::move(options), arena, classes)) {}

L2Tier::~L2Tier() { stop(); }

void L2Tier::start() {
  auto self = impl_;
  auto connected = [self](std::exception_ptr e) {
    if (e) common::LogEscaped{"the L2 connect loop"}(e);
    if (self->stopped) return;
    self->gate.spawn(self->write_loop(), common::LogEscaped{"the L2 writer"});
  };
  impl_->gate.spawn(impl_->connect(), std::move(connected));
}

asio::awaitable<std::size_t> L2Tier::drain(std::chrono::milliseconds bound) {
  auto impl = impl_;
  auto settled = [&] { return (impl->queue.empty() && impl->in_flight == 0) || !impl->ready; };
  co_await impl->settled.wait_until(settled, std::chrono::steady_clock::now() + bound);
  co_return impl->queue.size() + impl->in_flight;
}

asio::awaitable<void> L2Tier::close(std::chrono::milliseconds bound) {
  auto impl = impl_;
  impl->stopped = true;
  impl->wake.notify();
  impl->purge_wake.notify();
  if (!co_await impl->gate.close(bound))
    spdlog::warn("kvstrand-server: L2: {} coroutine(s) still running {} ms after close", impl->gate.inside(),
                 bound.count());
  if (impl->cluster) co_await impl->cluster->close(bound);
  stop();
}

void L2Tier::stop() {
  impl_->stopped = true;
  impl_->wake.notify();
  impl_->purge_wake.notify();
  // The Redis connections close now, on the strand (or with it stopped),
  // not when the last coroutine frame lets go of Impl: that can be while
  // the io_context is being destroyed, too late to post their completions.
  impl_->cluster.reset();
  // What is still queued stays read-locked: the server is going away with its arena.
}

void L2Tier::committed(tier::Index& index, std::span<const std::uint32_t> slots) { impl_->committed(index, slots); }

void L2Tier::set_events(TierEvents* events) {
  impl_->events = events;
  if (events) impl_->queue.set_descriptions(events->shared_descriptions());
}

std::size_t L2Tier::drop(const kv::Digest& ns) { return impl_->drop(ns); }

asio::awaitable<Promoted> L2Tier::promote(tier::Index& index, std::vector<kv::ChunkKey> keys,
                                          tier::TenantId tenant) {
  co_return co_await impl_->promote(index, std::move(keys), tenant);
}

L2Stats L2Tier::stats() const {
  L2Stats s = impl_->st;
  s.connected = impl_->ready;
  s.queue = impl_->queue.size();
  s.purges_pending = impl_->purges.size();
  if (impl_->cluster) s.redis = impl_->cluster->stats();
  return s;
}

}  // namespace kvstrand::server
