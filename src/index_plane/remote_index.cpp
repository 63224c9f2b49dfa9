#include "index_plane/remote_index.hpp"

#include "common/await_codes.hpp"

#include <spdlog/spdlog.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "device/device.hpp"
#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/namespace_id.hpp>
#include "index_plane/transfer_error.hpp"

namespace kvstrand::index_plane {

namespace asio = boost::asio;
using namespace proto;

RemoteIndex::RemoteIndex(reactor::Reactor& reactor, RemoteIndexOptions options)
    : session_(reactor, std::move(options), registrations()) {}

RemoteIndex::~RemoteIndex() = default;

// ---- the index plane's operations ----------------------------------------------------------

IndexPlane::LookupResult RemoteIndex::take_lease(std::uint32_t registration, const std::vector<kv::ChunkKey>& keys,
                                        LookupReply& r) {
  const std::uint32_t ct = registrations().at(registration).layout.chunk_tokens;
  const std::size_t n = ct ? r.hit.tokens / ct : 0;
  if (r.lease == 0 || n == 0) return LookupResult{r.hit, 0};
  if (n > keys.size() || r.offsets.size() != n) {
    spdlog::error("kvstrand: node tier: a lookup reply whose hit does not match its keys; treated as a miss");
    session_.release_hold(r.lease, session_.arena());
    return LookupResult{};
  }
  Lease l;
  l.registration = registration;
  l.keys.assign(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(n));
  l.offsets = r.offsets;
  l.checkpoints = r.hit.checkpoints;
  l.arena = session_.arena();
  leases_[r.lease] = std::move(l);
  return LookupResult{r.hit, r.lease};
}

asio::awaitable<IndexPlane::LookupResult> RemoteIndex::lookup(std::uint32_t registration, std::vector<kv::ChunkKey> keys) {
  if (registrations().find(registration) == nullptr) co_return LookupResult{};  // not attached: a miss
  if (Failure r = co_await session_.usable(registration); r) co_return LookupResult{};  // unreachable: a miss, recompute
  Request req = Lookup{session_.server_registration(registration), keys};
  std::pair<std::error_code, Reply> res = co_await session_.calls().call(std::move(req), Clock::now() + session_.request_timeout());
  if (res.first || res.second.status != Status::ok) co_return LookupResult{};
  co_return take_lease(registration, keys, std::get<LookupReply>(res.second.payload));
}

asio::awaitable<IndexPlane::LookupResult> RemoteIndex::adopt(std::uint32_t registration, std::uint64_t lease,
                                                   std::vector<kv::ChunkKey> keys) {
  if (registrations().find(registration) == nullptr) co_return LookupResult{};  // not attached: a miss
  if (Failure r = co_await session_.usable(registration); r) co_return LookupResult{};
  Request req = Adopt{session_.server_registration(registration), lease, keys};
  std::pair<std::error_code, Reply> res = co_await session_.calls().call(std::move(req), Clock::now() + session_.request_timeout());
  if (res.first) co_return LookupResult{};
  if (res.second.status != Status::ok) {
    spdlog::debug("kvstrand: node tier: lease {} not adopted: {}", lease, res.second.message);
    co_return LookupResult{};
  }
  co_return take_lease(registration, keys, std::get<LookupReply>(res.second.payload));
}

asio::awaitable<IndexPlane::Dropped> RemoteIndex::drop(std::uint32_t registration) {
  Dropped d;
  if (d.failure = co_await session_.usable(registration); d.failure) co_return d;
  if (session_.server_minor() < 3) {
    d.failure = Failure{TransferErrc::tier_unavailable,
                        "kvstrand-server at " + session_.socket() + " speaks protocol 2." + std::to_string(session_.server_minor()) +
                            ", and a drop needs 2.3: upgrade the server"};
    co_return d;
  }
  Reply reply;
  d.failure = co_await exchange(Drop{kv::namespace_of(registrations().at(registration).layout)},
                                Clock::now() + session_.request_timeout(), &reply);
  if (!d.failure) {
    const auto& r = std::get<DropReply>(reply.payload);
    d.objects = r.arena_objects + r.lower_objects;
  }
  co_return d;
}

asio::awaitable<void> RemoteIndex::release_lookup(std::uint64_t lease) {
  if (auto it = leases_.find(lease); it != leases_.end()) {
    session_.release_hold(lease, it->second.arena);
    leases_.erase(it);
  }
  co_return;
}

asio::awaitable<Failure> RemoteIndex::exchange(Request req, Clock::time_point deadline, Reply* out) {
  const char* what = to_string(type_of(req));
  std::pair<std::error_code, Reply> res = co_await session_.calls().call(std::move(req), deadline);
  if (res.first) {
    std::string why = "kvstrand-server at " + session_.socket() + " did not answer the " + what;
    // Unanswered at the transfer's deadline: that deadline is what ended it,
    // whichever of its timer and this request's ran first.
    if (Clock::now() >= deadline) co_return Failure{TransferErrc::deadline_exceeded, std::move(why) + " by its deadline"};
    if (!res.second.message.empty()) why += " (" + res.second.message + ")";
    co_return Failure{res.first, std::move(why)};
  }
  if (res.second.status != Status::ok)
    co_return Failure{status_error(res.second.status), std::string(to_string(res.second.status)) + ": " +
                                                       res.second.message};
  *out = std::move(res.second);
  co_return Failure{};
}

bool RemoteIndex::stores(std::uint32_t registration) const {
  return kv::writes_to_tier(registrations().at(registration).layout);
}

asio::awaitable<IndexPlane::Places> RemoteIndex::reserve(std::uint32_t registration,
                                                        const std::vector<kv::ChunkKey>& keys,
                                                        const std::vector<bool>& images,
                                                        const std::vector<std::string>& events,
                                                        Clock::time_point deadline) {
  Places p;
  if ((p.failure = co_await session_.usable(registration))) co_return p;
  const std::uint64_t object_bytes = registrations().at(registration).object_bytes();
  Reserve req;
  req.registration = session_.server_registration(registration);
  req.keys = keys;
  for (bool image : images) req.images.push_back(image);
  // A 2.3 server refuses bytes after the images: the events are for the
  // server's publisher only, so the save goes on without them.
  if (events.size() == keys.size() && session_.server_minor() >= 4) req.events = events;
  Request request = std::move(req);
  Reply reply;
  if ((p.failure = co_await exchange(std::move(request), deadline, &reply))) co_return p;
  const auto& rr = std::get<ReserveReply>(reply.payload);
  if (rr.chunks.size() != keys.size()) {
    session_.release_hold(rr.reservation, session_.arena());
    p.failure = {TransferErrc::tier_unavailable, "a reserve reply for " + std::to_string(rr.chunks.size()) + " of " +
                                                     std::to_string(keys.size()) + " chunks"};
    co_return p;
  }
  std::shared_ptr<ArenaMapping> arena = session_.arena();
  p.objects.assign(keys.size(), nullptr);
  p.full.assign(keys.size(), false);
  std::uint64_t end = 0;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    switch (rr.chunks[i]) {
      case ChunkState::existed: break;  // never rewritten
      case ChunkState::full:
        ++p.refused;
        p.full[i] = true;
        break;
      case ChunkState::reserved:
        // The server's offsets are checked like any other input: a bad one
        // must not make this process write outside the arena.
        if (!arena->contains(rr.offsets[i], object_bytes)) {
          session_.release_hold(rr.reservation, session_.arena());
          p.failure = {TransferErrc::tier_unavailable,
                       "the server reserved offset " + std::to_string(rr.offsets[i]) + ", outside its arena"};
          p.objects.clear();
          co_return p;
        }
        p.objects[i] = arena->base() + rr.offsets[i];
        end = std::max(end, rr.offsets[i] + object_bytes);
        break;
    }
  }
  if (rr.reservation == 0) {  // nothing reserved: nothing to copy or commit
    std::fill(p.objects.begin(), p.objects.end(), nullptr);
    co_return p;
  }
  if (std::error_code ec = co_await session_.pinned(arena, end)) {
    session_.release_hold(rr.reservation, session_.arena());
    p.failure = {ec, "the arena could not be pinned: " + session_.pinning_error()};
    p.objects.clear();
    co_return p;
  }
  p.hold = rr.reservation;
  p.memory = std::move(arena);
  co_return p;
}

asio::awaitable<Failure> RemoteIndex::commit(std::uint32_t, const std::vector<kv::ChunkKey>&, const Places& places,
                                             bool copied, Clock::time_point deadline) {
  // The reservation's id means something only to the server that granted
  // it: a restarted one may have given it to another process's reservation.
  if (!session_.current(places.memory))
    co_return Failure{TransferErrc::tier_unavailable,
                      "kvstrand-server at " + session_.socket() + " restarted since this save was reserved: not committed"};
  Request commit = Commit{places.hold, copied};
  Reply reply;
  co_return co_await exchange(std::move(commit), deadline, &reply);
}

asio::awaitable<IndexPlane::Held> RemoteIndex::hold(const kv::TransferSpec& s, Clock::time_point deadline) {
  Held h;
  const Registration& reg = registrations().at(s.registration);
  const std::uint64_t object_bytes = reg.object_bytes();
  const std::uint32_t ct = reg.layout.chunk_tokens;
  Lease lease;
  if (auto it = leases_.find(s.tier_lease);
      s.tier_lease != 0 && it != leases_.end() && it->second.registration == s.registration) {
    // A lease this process holds needs no server: its objects are mapped
    // and stay in place (a server that died meanwhile frees nothing under it).
    h.hold = it->first;
    lease = std::move(it->second);
    leases_.erase(it);
  } else {
    // No lease of this process's own lookup: lease exactly the spec's chunks.
    if ((h.failure = co_await session_.usable(s.registration))) co_return h;
    Request req = Lookup{session_.server_registration(s.registration), s.keys};
    Reply reply;
    if ((h.failure = co_await exchange(std::move(req), deadline, &reply))) co_return h;
    auto& r = std::get<LookupReply>(reply.payload);
    h.hold = r.lease;
    lease.arena = session_.arena();
    if (r.offsets.size() * ct != r.hit.tokens || r.hit.tokens / ct > s.keys.size()) {
      session_.release_hold(h.hold, lease.arena);
      h.failure = {TransferErrc::tier_unavailable, "a lookup reply whose hit does not match its keys"};
      co_return h;
    }
    lease.keys.assign(s.keys.begin(), s.keys.begin() + static_cast<std::ptrdiff_t>(r.offsets.size()));
    lease.offsets = std::move(r.offsets);
    lease.checkpoints = std::move(r.hit.checkpoints);
  }
  // Each of the spec's chunks in the lease, and whether an image is stored at its end.
  std::uint64_t end = 0;
  std::size_t last = 0;
  for (const kv::ChunkKey& k : s.keys) {
    const auto at = std::find_if(lease.keys.begin(), lease.keys.end(), [&k](const kv::ChunkKey& x) {
      return x.ns == k.ns && x.kv_rank == k.kv_rank && x.hash == k.hash;
    });
    if (at == lease.keys.end()) {
      h.objects.push_back(nullptr);  // the data path says it is missing, and releases the hold
      continue;
    }
    last = static_cast<std::size_t>(at - lease.keys.begin());
    const std::uint64_t off = lease.offsets[last];
    if (!lease.arena || !lease.arena->contains(off, object_bytes)) {
      session_.release_hold(h.hold, lease.arena);
      h.failure = {TransferErrc::tier_unavailable,
                   "the server leased offset " + std::to_string(off) + ", outside its arena"};
      h.objects.clear();
      co_return h;
    }
    h.objects.push_back(lease.arena->base() + off);
    end = std::max(end, off + object_bytes);
  }
  h.image_at_end = std::find(lease.checkpoints.begin(), lease.checkpoints.end(), (last + 1) * ct) !=
                   lease.checkpoints.end();
  const bool whole = std::none_of(h.objects.begin(), h.objects.end(), [](std::byte* p) { return p == nullptr; });
  if (whole && lease.arena->pinned_bytes() < end) {
    if (std::error_code ec = co_await session_.pinned(lease.arena, end)) {
      session_.release_hold(h.hold, lease.arena);
      const std::string& why = session_.pinning_error();
      h.failure = {ec, "the arena could not be pinned" + (why.empty() ? std::string() : ": " + why)};
      h.objects.clear();
      co_return h;
    }
  }
  h.memory = std::move(lease.arena);
  co_return h;
}

void RemoteIndex::release(const kv::TransferSpec&, const Held& held) {
  session_.release_hold(held.hold, std::static_pointer_cast<ArenaMapping>(held.memory));
}

asio::awaitable<Failure> RemoteIndex::attach_registration(std::uint32_t id) { return session_.attach(id); }

asio::awaitable<void> RemoteIndex::drain() {
  // Leases no load named go back with the session's end (best effort: a
  // lost connection leaves them to the process's exit).
  if (session_.connected())
    for (auto& [id, l] : std::exchange(leases_, {})) session_.release_hold(id, l.arena);
  co_await session_.close();
}

}  // namespace kvstrand::index_plane
