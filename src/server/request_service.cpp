#include "server/request_service.hpp"

#include <spdlog/spdlog.h>

#include <memory>
#include <new>
#include <string>

#include <kvstrand/digest.hpp>
#include <kvstrand/namespace_id.hpp>

#include "common/parse_bytes.hpp"

namespace kvstrand::server {

using namespace proto;

namespace {
// How many of `keys`, from the first, are of the registration's namespace.
std::size_t own_run(const Client::Reg& r, std::span<const kv::ChunkKey> keys) {
  if (!r.ns) return keys.size();
  std::size_t n = 0;
  while (n < keys.size() && keys[n].ns == *r.ns) ++n;
  return n;
}
}  // namespace

RequestService::RequestService(ServiceRules rules, ServerFacts facts, tier::SizeClasses& classes,
                               std::vector<LowerLevel*> levels)
    : rules_(rules), facts_(std::move(facts)), classes_(classes), levels_(std::move(levels)) {}

boost::asio::awaitable<void> RequestService::promote(Client& c, const Lookup& m, const bool& gone) {
  c.promote_miss = LevelMiss::none;
  c.promoted.clear();
  c.present_before = 0;
  tier::Index* into = index_of(c, m.registration);
  if (into == nullptr || levels_.empty()) co_return;
  // Another namespace's chunks are not this registration's to bring up.
  const std::span<const kv::ChunkKey> own(m.keys.data(), own_run(c.regs.at(m.registration), m.keys));
  std::size_t have = into->present_run(own);
  c.present_before = have;
  // Taken now: the registration may be gone when a level's answer comes.
  const tier::TenantId tenant = c.regs.at(m.registration).tenant;
  for (LowerLevel* level : levels_) {
    if (have == own.size() || gone) break;
    std::vector<kv::ChunkKey> rest(own.begin() + static_cast<std::ptrdiff_t>(have), own.end());
    const Promoted p = co_await level->promote(*into, std::move(rest), tenant);
    have += p.have;
    if (p.have != 0) c.promoted.emplace_back(level->name(), p.have);
    // The nearest level's reason: what the chunk it stopped at had there.
    if (c.promote_miss == LevelMiss::none) c.promote_miss = p.why;
  }
}

const char* RequestService::miss_reason(const Client& c, const tier::Index& index, const kv::ChunkKey& key) const {
  if (c.promote_miss == LevelMiss::refused_value) return "checksum_or_mac";
  if (c.promote_miss == LevelMiss::timeout) return "timeout";
  if (dropped_.contains(key.ns)) return "dropped";
  if (index.evicted_recently(key)) return "evicted";
  if (!index.holds_namespace(key.ns)) return "other_namespace";
  return "never_stored";
}

tier::Index* RequestService::index_of(const Client& c, std::uint32_t registration) const {
  auto it = c.regs.find(registration);
  return it == c.regs.end() ? nullptr : it->second.index;
}

Reply RequestService::handle(Client& c, const Request& req) {
  history_.tick(TierHistory::Clock::now(), classes_);
  if (std::holds_alternative<Hello>(req)) {
    if (c.hello) return fail(Status::bad_request, "hello was already said on this connection");
    const Hello& hello = std::get<Hello>(req);
    if (!hello.reads.empty()) {
      // Named openly: which tenants publish is no secret, what they hold is.
      auto it = facts_.published.find(hello.reads);
      if (it == facts_.published.end())
        return fail(Status::not_authorized, "tenant '" + hello.reads + "' publishes nothing (--public-tenant)");
      c.pool = it->second;
      c.reads = hello.reads;
    }
    c.hello = true;
    c.minor = hello.minor;
    // A 2.1 client reads no server_id: it refuses bytes it does not know.
    const bool says_id = std::get<Hello>(req).minor >= 2;
    // Of its pool: the slabs populated so far are numbered the arena's first.
    const std::uint64_t bytes = c.pool == 0 ? facts_.arena_bytes : classes_.pool_bytes(c.pool);
    const std::uint64_t base = classes_.pool_base(c.pool), ready = facts_.ready_bytes ? facts_.ready_bytes() : 0;
    return Reply{Status::ok, "",
                 HelloReply{c.session, kMajor, kMinor, bytes, facts_.slab_bytes,
                            std::min(bytes, ready > base ? ready - base : 0), facts_.huge_pages,
                            says_id ? facts_.server_id : 0}};
  }
  if (!c.hello) return fail(Status::bad_request, "send hello first");
  if (const auto* m = std::get_if<RegisterLayout>(&req)) return register_layout(c, *m);
  if (const auto* m = std::get_if<Unregister>(&req)) {
    if (c.regs.erase(m->registration) == 0) return fail(Status::unknown_registration, "no such registration");
    return Reply{};
  }
  if (const auto* m = std::get_if<Lookup>(&req)) return lookup(c, *m);
  if (const auto* m = std::get_if<Adopt>(&req)) return adopt(c, *m);
  if (const auto* m = std::get_if<Release>(&req)) {
    // Only its owner's (the process that made it, or adopted it): another
    // process's hold is answered exactly as one that never existed.
    tier::Index* idx = classes_.index_of_hold(m->hold);
    if (!idx || idx->owner_of(m->hold) != c.owner || !idx->release(m->hold))
      return fail(Status::unknown_hold, "no lease or reservation " + std::to_string(m->hold));
    return Reply{};
  }
  if (const auto* m = std::get_if<Reserve>(&req)) return reserve(c, *m);
  if (const auto* m = std::get_if<Commit>(&req)) return commit(c, *m);
  if (const auto* m = std::get_if<Drop>(&req)) return drop(c, *m);
  if (const auto* m = std::get_if<DropTenant>(&req)) return drop_tenant(c, *m);
  if (std::holds_alternative<Stats>(req)) return stats();
  return Reply{};  // end_session, ping
}

// A slot's place as the client sees it: in the memory it was handed (its
// pool), which starts at 0 in its mapping.
std::uint64_t RequestService::offset_in_pool(const Client& c, const tier::Index& index, std::uint32_t slot) const {
  return classes_.offset_of(index, slot) - classes_.pool_base(c.pool);
}

Reply RequestService::register_layout(Client& c, const RegisterLayout& m) {
  const kv::Layout& l = m.layout;
  if (auto err = kv::validate(l)) return fail(Status::bad_request, err->describe());
  if (l.chunk_tokens != rules_.chunk_tokens)
    return fail(Status::bad_request, "layout chunk_tokens " + std::to_string(l.chunk_tokens) +
                                         " differs from the server's --chunk-tokens " +
                                         std::to_string(rules_.chunk_tokens));
  const std::uint64_t object = l.object_bytes(l.has_state());
  if (object > facts_.slab_bytes)
    return fail(Status::bad_request, "an object of this layout (" + std::to_string(object) +
                                         " B) is larger than the server's --slab-bytes (" +
                                         std::to_string(facts_.slab_bytes) + " B)");
  if (object < rules_.min_object_bytes)
    return fail(Status::bad_request, "an object of this layout (" + std::to_string(object) +
                                         " B) is smaller than the server's --min-object-bytes (" +
                                         std::to_string(rules_.min_object_bytes) + " B): store larger chunks");
  // Were every slab given to this size: the index's memory at most.
  const tier::SlabGeometry g = classes_.geometry(object);
  const std::uint64_t slabs = facts_.arena_bytes / facts_.slab_bytes;
  const std::uint64_t index_bytes = slabs * g.per_slab * tier::Index::bytes_per_slot();
  if (index_bytes > rules_.max_index_bytes)
    return fail(Status::bad_request, "objects of this layout (" + std::to_string(object) + " B) would need an index of " +
                                         common::format_bytes(index_bytes) + " over this arena, more than the server's "
                                         "--max-index-bytes (" + common::format_bytes(rules_.max_index_bytes) +
                                         "): store larger chunks, or raise --max-index-bytes");
  tier::Index* idx = classes_.index(object, c.pool);
  if (!idx)
    return fail(Status::bad_request, "this layout's objects (" + std::to_string(object) + " B) would be the " +
                                         std::to_string(tier::SizeClasses::kMaxClasses + 1) +
                                         "th object size this server serves");
  // A session reading a published tenant registers that tenant's layouts.
  if (!c.reads.empty() && l.tenant != c.reads)
    return fail(Status::not_authorized, "this session reads tenant '" + c.reads + "' (its hello's reads): its "
                                        "layouts' tenant must be '" + c.reads + "', not '" + l.tenant + "'");
  // A process the kernel says is a tenant's registers as that tenant only.
  if (c.reads.empty() && !c.peer.tenant.empty() && l.tenant != c.peer.tenant)
    return fail(Status::not_authorized, "this process (uid " + std::to_string(c.peer.uid) + ") is tenant '" +
                                            c.peer.tenant + "' (--tenant-uid, --tenant-gid): its layouts' tenant must "
                                            "be '" + c.peer.tenant + "', not '" + l.tenant + "'");
  // Its namespace is checked on every key: a tenant's client must say all of it.
  if (!c.peer.tenant.empty() && c.minor < 5)
    return fail(Status::not_authorized, "this server binds tenants to users (--tenant-uid, --tenant-gid) and checks "
                                        "each key's namespace, which protocol 2." + std::to_string(c.minor) +
                                        " cannot tell it: upgrade the client library to 2.5");
  // Last: a tenant made here is kept, so only for a registration that is served.
  std::optional<tier::TenantId> tenant = tenants_ ? tenants_->id_of(l.tenant) : tier::TenantId{0};
  if (!tenant)
    return fail(Status::bad_request, "this server serves at most " + std::to_string(tenants_->max_tenants()) +
                                         " tenants (--max-tenants), and tenant '" + l.tenant + "' is not one of them");
  const std::uint32_t id = next_reg_++;
  const kv::Digest ns = kv::namespace_of(l);
  c.regs[id] = Client::Reg{l, idx, *tenant, c.minor >= 5 ? std::optional(ns) : std::nullopt};
  if (named_.insert_or_assign(ns, NamespaceName{l.model_id, l.layout_name, l.tenant}).second) {
    named_order_.push_back(ns);
    if (named_order_.size() > kNamedNamespaces) {
      named_.erase(named_order_.front());
      named_order_.pop_front();
    }
  }
  return Reply{Status::ok, "", RegisterReply{id, object}};
}

Reply RequestService::lookup(Client& c, const Lookup& m) {
  auto it = c.regs.find(m.registration);
  if (it == c.regs.end()) return fail(Status::unknown_registration, "no such registration");
  const kv::Layout& l = it->second.layout;
  tier::Index& index = *it->second.index;
  // Hits within the registration's namespace only: another's chunk is a
  // miss, as one never stored.
  const std::span<const kv::ChunkKey> keys(m.keys.data(), own_run(it->second, m.keys));
  // The quota is checked against the longest hit the keys could give, so
  // that nothing is leased and then refused.
  const auto held = classes_.held_by(c.owner);
  const std::uint64_t most = keys.size() * index.object_bytes();
  if (held.leased_bytes + most > rules_.max_client_leased) {
    const kv::HitSource peek = index.lookup(keys, l.chunk_tokens);
    if (held.leased_bytes + peek.tokens / l.chunk_tokens * index.object_bytes() > rules_.max_client_leased)
      return fail(Status::over_quota, "this process's leases would pin more than --max-client-leased (" +
                                          std::to_string(rules_.max_client_leased) + " B); release some first");
  }
  tier::Index::Lease lease = index.lease(keys, l.chunk_tokens, c.owner);
  if (lease.slots.size() < m.keys.size())
    ++lookup_misses_[common::labels(
        {{"reason", lease.slots.size() == keys.size() ? "other_namespace"
                                                      : miss_reason(c, index, m.keys[lease.slots.size()])}})];
  c.promote_miss = LevelMiss::none;
  count_hits(c, it->second, lease.slots.size());
  LookupReply r;
  r.lease = lease.id;
  r.hit = std::move(lease.hit);
  for (std::uint32_t slot : lease.slots) r.offsets.push_back(offset_in_pool(c, index, slot));
  return Reply{Status::ok, "", std::move(r)};
}

void RequestService::count_hits(Client& c, const Client::Reg& reg, std::size_t hits) {
  const std::string tenant = tenants_ && reg.tenant < tenants_->size() ? tenants_->name(reg.tenant) : "";
  // The arena's run first, then each level's in the order they promoted;
  // what is left (stored meanwhile by another session) the arena's too.
  std::size_t arena = levels_.empty() ? hits : std::min(hits, c.present_before);
  std::size_t left = hits - arena;
  for (const auto& [level, n] : c.promoted) {
    const std::size_t mine = std::min(left, n);
    if (mine != 0) lookup_hits_[common::labels({{"level", level}, {"tenant", tenant}})] += mine;
    left -= mine;
  }
  arena += left;
  if (arena != 0) lookup_hits_[common::labels({{"level", "arena"}, {"tenant", tenant}})] += arena;
  c.promoted.clear();
  c.present_before = 0;
}

// Another process's lease made this client's process's: the hand-off of a
// scheduler's lookup to the worker that loads it. The lease must still hold
// exactly `keys`, and be of this registration's objects.
Reply RequestService::adopt(Client& c, const Adopt& m) {
  auto it = c.regs.find(m.registration);
  if (it == c.regs.end()) return fail(Status::unknown_registration, "no such registration");
  tier::Index* idx = classes_.index_of_hold(m.lease);
  const std::vector<std::uint32_t> slots = idx ? idx->hold_slots(m.lease) : std::vector<std::uint32_t>{};
  if (idx != it->second.index || slots.size() != m.keys.size() || !idx->adoptable(m.lease) ||
      own_run(it->second, m.keys) != m.keys.size())
    return fail(Status::unknown_hold, "no lease " + std::to_string(m.lease) + " of these " +
                                          std::to_string(m.keys.size()) + " chunks of this registration's objects");
  for (std::size_t i = 0; i < slots.size(); ++i)
    if (!(idx->key_at(slots[i]) == m.keys[i]))
      return fail(Status::unknown_hold, "lease " + std::to_string(m.lease) + " holds other chunks");
  // A lease this process holds already counts once, not again as adopted.
  const auto held = classes_.held_by(c.owner);
  const std::uint64_t adds = idx->owner_of(m.lease) == c.owner ? 0 : slots.size() * idx->object_bytes();
  if (held.leased_bytes + adds > rules_.max_client_leased)
    return fail(Status::over_quota, "this process's leases would pin more than --max-client-leased (" +
                                        std::to_string(rules_.max_client_leased) + " B); release some first");
  idx->adopt(m.lease, c.owner);
  LookupReply r;
  r.lease = m.lease;
  const std::uint32_t ct = it->second.layout.chunk_tokens;
  // Fits 32 bits: Index::run ended the lease's run before any chunk whose end would not.
  r.hit.tokens = static_cast<std::uint32_t>(slots.size()) * ct;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (idx->image_at(slots[i])) r.hit.checkpoints.push_back(static_cast<std::uint32_t>(i + 1) * ct);
    r.offsets.push_back(offset_in_pool(c, *idx, slots[i]));
  }
  return Reply{Status::ok, "", std::move(r)};
}

Reply RequestService::reserve(Client& c, const Reserve& m) {
  auto it = c.regs.find(m.registration);
  if (it == c.regs.end()) return fail(Status::unknown_registration, "no such registration");
  tier::Index& index = *it->second.index;
  if (!c.reads.empty())
    return fail(Status::not_authorized, "this session reads tenant '" + c.reads + "''s published objects: it stores "
                                        "nothing (store through a session of your own)");
  if (m.images.size() != m.keys.size())
    return fail(Status::bad_request, std::to_string(m.images.size()) + " image flags for " +
                                         std::to_string(m.keys.size()) + " keys");
  // Another namespace's chunks are not this registration's to write.
  if (const std::size_t own = own_run(it->second, m.keys); own != m.keys.size())
    return fail(Status::bad_request, "key " + std::to_string(own) + " of " + std::to_string(m.keys.size()) +
                                         " is not of this registration's namespace");
  // Counted by what it would hold: keys stored already (or being written by
  // anyone) take nothing.
  const auto held = classes_.held_by(c.owner);
  if (held.reserved_bytes + index.absent(m.keys) * index.object_bytes() > rules_.max_client_reserved)
    return fail(Status::over_quota, "this process's reservations would hold more than --max-client-reserved (" +
                                        std::to_string(rules_.max_client_reserved) + " B); commit some first");
  std::unique_ptr<bool[]> images(new bool[m.keys.size()]);
  for (std::size_t i = 0; i < m.keys.size(); ++i) images[i] = m.images[i] != 0;
  tier::Index::Reservation res;
  try {
    classes_.make_room(index, m.keys.size() - index.present_run(m.keys));
    res = index.reserve(m.keys, std::span<const bool>(images.get(), m.keys.size()), c.owner, it->second.tenant);
  } catch (const std::bad_alloc&) {
    // Out of memory: refused whole (every chunk full), the index as it was
    // (make_room and reserve are all or nothing); the session goes on.
    spdlog::warn("kvstrand-server: a reserve of {} chunks found no memory for the index: refused as full",
                 m.keys.size());
    ReserveReply full;
    full.chunks.assign(m.keys.size(), ChunkState::full);
    full.offsets.assign(m.keys.size(), 0);
    return Reply{Status::ok, "", std::move(full)};
  }
  if (events_ != nullptr && !m.events.empty()) describe(index, m, res);
  ReserveReply r;
  r.reservation = res.id;
  for (std::size_t i = 0; i < m.keys.size(); ++i) {
    r.chunks.push_back(static_cast<ChunkState>(res.chunks[i]));
    r.offsets.push_back(res.chunks[i] == tier::Index::Chunk::reserved ? offset_in_pool(c, index, res.slots[i]) : 0);
  }
  return Reply{Status::ok, "", std::move(r)};
}

// A description the events cannot use is not kept (the save goes on: its
// objects are stored, not announced), counted, and said once.
void RequestService::describe(const tier::Index& index, const Reserve& m, const tier::Index::Reservation& res) {
  for (std::size_t i = 0; i < m.keys.size(); ++i) {
    if (res.chunks[i] != tier::Index::Chunk::reserved || m.events[i].empty()) continue;
    if (auto problem = description_problem(m.events[i])) {
      events_->count_refused();
      if (!warned_description_)
        spdlog::warn("kvstrand-server: a chunk's event description was refused ({}); its objects are stored but "
                     "not announced (said once; /metrics counts them)", *problem);
      warned_description_ = true;
      continue;
    }
    events_->describe(index, res.slots[i], m.events[i]);
  }
}

Reply RequestService::commit(const Client& c, const Commit& m) {
  // Taken before the commit ends the hold: what the levels below write behind.
  tier::Index* idx = classes_.index_of_hold(m.hold);
  // Only its owner commits it: another's commit would publish bytes its
  // writer has not finished (or never began) copying.
  if (idx != nullptr && idx->owner_of(m.hold) != c.owner) idx = nullptr;
  const std::vector<std::uint32_t> slots = (!levels_.empty() || events_ != nullptr) && idx && m.ok
                                              ? idx->hold_slots(m.hold)
                                              : std::vector<std::uint32_t>{};
  if (!idx || !idx->commit(m.hold, m.ok)) return fail(Status::unknown_hold, "no reservation " + std::to_string(m.hold));
  if (!slots.empty())
    for (LowerLevel* level : levels_) level->committed(*idx, slots);
  // Announced, and the levels hold what they write behind: the slots keep
  // BlockRemoved's part of their descriptions alone.
  if (events_ != nullptr) events_->keep_removal_only(*idx, slots);
  return Reply{};
}

bool RequestService::owns_namespace(const Client& c, const kv::Digest& ns) const {
  if (!c.reads.empty()) return false;  // its registrations are the publisher's
  for (const auto& [id, reg] : c.regs)
    if (reg.ns == ns) return true;
  std::set<kv::Digest> spaces;
  if (tenants_)
    if (auto t = tenants_->find(c.peer.tenant)) spaces = classes_.namespaces_of(*t);
  for (LowerLevel* level : levels_) level->tenant_namespaces(c.peer.tenant, spaces);
  return spaces.contains(ns);
}

// Whose: an admin's (the server's user, root, --admin-group) any; a
// tenant's client's only its tenant's. The same refusal for a namespace of
// another tenant as for one that does not exist: no oracle.
Reply RequestService::drop(const Client& c, const Drop& m) {
  if (!c.peer.admin && (c.peer.tenant.empty() || !owns_namespace(c, m.ns)))
    return fail(Status::not_authorized, "namespace " + kv::to_hex(m.ns) + " is not tenant '" + c.peer.tenant +
                                            "''s: only the server's user, root or --admin-group drop another's");
  return drop_one(m.ns);
}

Reply RequestService::drop_one(const kv::Digest& ns) {
  const Drop m{ns};
  DropReply r;
  if (dropped_.insert(m.ns).second) {
    drop_order_.push_back(m.ns);
    if (drop_order_.size() > kRememberedDrops) {
      dropped_.erase(drop_order_.front());
      drop_order_.pop_front();
    }
  }
  r.arena_objects = classes_.drop_namespace(m.ns);
  for (LowerLevel* level : levels_) r.lower_objects += level->drop(m.ns);
  spdlog::info("kvstrand-server: namespace {} dropped: {} objects in the arena, {} below", kv::to_hex(m.ns),
               r.arena_objects, r.lower_objects);
  return Reply{Status::ok, "", r};
}

Reply RequestService::drop_tenant(const Client& c, const DropTenant& m) {
  if (m.tenant.empty()) return fail(Status::bad_request, "a tenant to drop needs a name");
  if (auto why = kv::tenant_problem(m.tenant)) return fail(Status::bad_request, *why);
  if (!c.peer.admin && m.tenant != c.peer.tenant)
    return fail(Status::not_authorized, "this process is tenant '" + c.peer.tenant + "', not '" + m.tenant +
                                            "': only the server's user, root or --admin-group drop another tenant");
  std::set<kv::Digest> spaces;
  if (tenants_)
    if (auto t = tenants_->find(m.tenant)) spaces = classes_.namespaces_of(*t);
  for (LowerLevel* level : levels_) level->tenant_namespaces(m.tenant, spaces);
  DropReply r;
  for (const kv::Digest& ns : spaces) {
    const Reply one = drop_one(ns);
    r.arena_objects += std::get<DropReply>(one.payload).arena_objects;
    r.lower_objects += std::get<DropReply>(one.payload).lower_objects;
  }
  spdlog::info("kvstrand-server: tenant {} dropped: {} namespaces, {} objects in the arena, {} below", m.tenant,
               spaces.size(), r.arena_objects, r.lower_objects);
  return Reply{Status::ok, "", r};
}

Reply RequestService::stats() const {
  const tier::Index::Stats st = classes_.stats();
  StatsReply r;
  r.capacity_bytes = facts_.arena_bytes;  // and the tenants' segments beside it
  for (std::size_t p = 1; p < classes_.pools(); ++p) r.capacity_bytes += classes_.pool_bytes(p);
  r.ready_bytes = facts_.ready_bytes ? facts_.ready_bytes() : 0;
  r.used_bytes = st.used_bytes;
  r.objects = st.objects;
  r.pinned = st.pinned;
  r.evictions = st.evictions;
  r.sessions = facts_.sessions ? facts_.sessions() : 0;
  r.leases = st.leases;
  r.reservations = st.reservations;
  r.refused_full = st.refused_full;
  return Reply{Status::ok, "", r};
}

}  // namespace kvstrand::server
