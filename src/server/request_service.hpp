// The rules of kvstrand-server's requests, with no socket: what a client
// may ask in which order (hello first, its own registrations), its quotas,
// and what each request does to the index. kvstrand-server's sessions feed
// it decoded requests and send back what it answers; tests drive it alone.
//
// On the server's strand. It never touches the arena's bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <deque>
#include <set>
#include <span>

#include <kvstrand/layout.hpp>
#include <boost/asio/awaitable.hpp>
#include <vector>

#include "common/metrics.hpp"
#include "proto/protocol.hpp"
#include "server/levels/lower_level.hpp"
#include "server/peer_identity.hpp"
#include "server/events/tier_events.hpp"
#include "server/tier_history.hpp"
#include "tier/index.hpp"
#include "tier/size_classes.hpp"

namespace kvstrand::server {

// The limits the service enforces, from the server's options.
struct ServiceRules {
  std::uint32_t chunk_tokens = 256;
  std::uint64_t max_client_leased = ~0ull;    // bytes one process's leases may pin
  std::uint64_t max_client_reserved = ~0ull;  // bytes one process's reservations may hold
  // A registration's objects must be at least this large (--min-object-bytes),
  // and their size class's index, were the whole arena given to it, at most
  // max_index_bytes (--max-index-bytes): a tiny object would make the index
  // one entry per few bytes of arena.
  std::uint64_t min_object_bytes = 512;
  std::uint64_t max_index_bytes = 1ull << 30;
};

// What the service says about the server in a hello or a stats reply.
struct ServerFacts {
  std::uint64_t arena_bytes = 0;
  std::uint64_t slab_bytes = 0;
  bool huge_pages = false;
  std::function<std::uint64_t()> ready_bytes;  // of the arena, slabs ready so far
  std::function<std::size_t()> sessions;       // connected now
  std::uint64_t server_id = 0;                 // this server's life (HelloReply::server_id)
  // Published tenants (--public-tenant) and their pools: a hello's `reads`.
  std::map<std::string, std::size_t> published;
};

// One client connection, as the service knows it.
struct Client {
  struct Reg {
    kv::Layout layout;
    tier::Index* index = nullptr;  // the size class of its objects
    tier::TenantId tenant = 0;     // whose objects it stores (Layout::tenant)
    // Its namespace (kv::namespace_of its layout): every key it names must
    // be of it. None from a client older than 2.5, which does not say its
    // weight version: its keys are taken as they come.
    std::optional<kv::Digest> ns;
  };
  std::uint64_t session = 0;
  tier::Owner owner = 0;  // the client's process: what it holds is the process's
  // Who the kernel says it is (an admin of no tenant unless told: the
  // server's own user, as every client is with no --tenant-uid map).
  Peer peer{0, true, {}};
  // The memory it is handed (SizeClasses' pool): its tenant's segment, or
  // the arena (0). Its registrations' objects are there; the offsets it is
  // told are from the pool's start.
  std::size_t pool = 0;
  // The published tenant this session reads (its hello's `reads`), its
  // pool the one above: it registers that tenant's layouts only, and
  // stores and drops nothing. Empty: a session of its own tenant.
  std::string reads;
  bool hello = false;
  std::uint8_t minor = 0;  // of the protocol, from its hello
  std::map<std::uint32_t, Reg> regs;
  // Why the levels below stopped short in the promotion before this
  // session's lookup (its miss's reason, if it misses there).
  LevelMiss promote_miss = LevelMiss::none;
  // What the promotion before this session's lookup found: the run the
  // arena held already, then what each level below brought up (by name).
  std::size_t present_before = 0;
  std::vector<std::pair<const char*, std::size_t>> promoted;
};

class RequestService {
 public:
  // `levels`: below the arena, nearest first (the disk, then L2): a
  // commit's objects are written behind to each, a lookup's misses are
  // promoted from them. None: the arena alone.
  RequestService(ServiceRules rules, ServerFacts facts, tier::SizeClasses& classes,
                 std::vector<LowerLevel*> levels = {});

  proto::Reply handle(Client& c, const proto::Request& req);
  // Before a lookup is handled: what the arena misses of its keys, the
  // levels below may hold. Each, in order, promotes the run after what the
  // arena holds then (bounded by its own timeout); `gone` (the session
  // ended meanwhile) stops it. Only the asking session waits: the strand
  // serves the others meanwhile.
  boost::asio::awaitable<void> promote(Client& c, const proto::Lookup& m, const bool& gone);
  // The index of one of the client's registrations (nullptr: not its).
  tier::Index* index_of(const Client& c, std::uint32_t registration) const;
  // Lookups that stopped short of their keys, by why the first missing
  // chunk is missing, the first that applies: "checksum_or_mac" (a level
  // below refused its value), "timeout" (a level below did not answer in
  // time), "dropped" (its namespace was dropped here), "evicted" (among the
  // arena's last 65,536 evictions),
  // "other_namespace" (the arena holds nothing of its namespace: another
  // model, weight version or tenant; or the key is not of the asking
  // registration's namespace), else "never_stored".
  const common::LabeledCounter& lookup_misses() const noexcept { return lookup_misses_; }
  // Chunks lookups hit, by the level each came from ("arena", or a level
  // below that promoted it for that lookup) and the registration's tenant.
  const common::LabeledCounter& lookup_hits() const noexcept { return lookup_hits_; }
  // The tier's last minutes (/debug/history), sampled as requests come.
  TierHistory& history() noexcept { return history_; }
  // What a namespace is, for a person (/debug/tier): the model, layout and
  // tenant of a registration that named it; the last kNamedNamespaces.
  struct NamespaceName {
    std::string model, layout, tenant;
  };
  const std::map<kv::Digest, NamespaceName>& namespace_names() const noexcept { return named_; }
  // With --events: the chunk descriptions reserves carry are kept for them.
  void set_events(TierEvents* events) noexcept { events_ = events; }
  // The arena's tenants: a registration's objects are its layout's tenant's.
  void set_tenants(tier::TenantBook* tenants) noexcept { tenants_ = tenants; }

 private:
  proto::Reply register_layout(Client& c, const proto::RegisterLayout& m);
  proto::Reply lookup(Client& c, const proto::Lookup& m);
  proto::Reply adopt(Client& c, const proto::Adopt& m);
  proto::Reply reserve(Client& c, const proto::Reserve& m);
  void describe(const tier::Index& index, const proto::Reserve& m, const tier::Index::Reservation& res);
  proto::Reply commit(const Client& c, const proto::Commit& m);
  proto::Reply drop(const Client& c, const proto::Drop& m);
  proto::Reply drop_tenant(const Client& c, const proto::DropTenant& m);
  proto::Reply drop_one(const kv::Digest& ns);
  // Whether `ns` is c's tenant's to drop: a namespace of one of its
  // registrations, or one its tenant holds objects of here or below.
  bool owns_namespace(const Client& c, const kv::Digest& ns) const;
  const char* miss_reason(const Client& c, const tier::Index& index, const kv::ChunkKey& key) const;
  proto::Reply stats() const;
  std::uint64_t offset_in_pool(const Client& c, const tier::Index& index, std::uint32_t slot) const;

  ServiceRules rules_;
  ServerFacts facts_;
  tier::SizeClasses& classes_;
  std::vector<LowerLevel*> levels_;
  std::uint32_t next_reg_ = 1;
  common::LabeledCounter lookup_misses_;
  common::LabeledCounter lookup_hits_;
  void count_hits(Client& c, const Client::Reg& reg, std::size_t hits);
  // Namespaces dropped on this server (a miss's reason "dropped"): the last
  // kRememberedDrops only, oldest first in drop_order_.
  static constexpr std::size_t kRememberedDrops = 1 << 16;
  std::set<kv::Digest> dropped_;
  std::deque<kv::Digest> drop_order_;
  TierEvents* events_ = nullptr;
  tier::TenantBook* tenants_ = nullptr;
  bool warned_description_ = false;
  TierHistory history_;
  static constexpr std::size_t kNamedNamespaces = 4096;
  std::map<kv::Digest, NamespaceName> named_;
  std::deque<kv::Digest> named_order_;  // oldest first
};

}  // namespace kvstrand::server
