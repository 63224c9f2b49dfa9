// The remote index plane: kvstrand-server keeps the index and the arena,
// this process maps the arena and (through HostTier) moves the bytes. What
// the requests mean is here; the connection's life (connect, back-off,
// hello and the arena, registrations, reconnects) is ServerSession's.
//
// All on the reactor strand:
// - lookup() returns the hit, a lease id and each leased object's place in
//   the arena; a load naming that lease holds it, and releases it after;
// - reserve() asks for places, commit() publishes or gives them back;
// - requests are bounded by request_timeout (lookups, attach) or the
//   transfer's own deadline; a reply that comes after its caller gave up
//   releases what it granted.
// The server is needed only to reserve, commit and look up: a load with a
// lease completes whatever the server does meanwhile. If the connection
// drops, requests waiting for a reply fail at once (tier_unavailable: no
// copy was made for them) and the next request reconnects (a restarted
// server's new arena is mapped anew; the old mapping stays until no copy
// uses it). Until a server answers, lookups miss and saves end
// tier_unavailable.
// With replicated_across_tp only rank 0 stores; every rank reads (F34).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "proto/protocol.hpp"
#include "index_plane/arena_mapping.hpp"
#include "index_plane/index_plane.hpp"
#include "reactor/reactor.hpp"
#include "index_plane/server_session.hpp"

namespace kvstrand::index_plane {

// With `reads` set, nothing is stored.
using RemoteIndexOptions = ServerSessionOptions;


class RemoteIndex final : public IndexPlane {
 public:
  RemoteIndex(reactor::Reactor& reactor, RemoteIndexOptions options);
  ~RemoteIndex() override;

  boost::asio::awaitable<LookupResult> lookup(std::uint32_t registration, std::vector<kv::ChunkKey> keys) override;
  boost::asio::awaitable<void> release_lookup(std::uint64_t lease) override;
  boost::asio::awaitable<LookupResult> adopt(std::uint32_t registration, std::uint64_t lease,
                                             std::vector<kv::ChunkKey> keys) override;
  void forget_lease(std::uint64_t lease) override { leases_.erase(lease); }
  bool stores(std::uint32_t registration) const override;
  boost::asio::awaitable<Places> reserve(std::uint32_t registration, const std::vector<kv::ChunkKey>& keys,
                                         const std::vector<bool>& images, const std::vector<std::string>& events,
                                         Clock::time_point deadline) override;
  boost::asio::awaitable<Failure> commit(std::uint32_t registration, const std::vector<kv::ChunkKey>& keys,
                                         const Places& places, bool copied, Clock::time_point deadline) override;
  boost::asio::awaitable<Held> hold(const kv::TransferSpec& spec, Clock::time_point deadline) override;
  void release(const kv::TransferSpec& spec, const Held& held) override;
  std::shared_ptr<void> memory() const override { return session_.arena(); }
  tier::Index::Stats stats() const override { return {}; }  // the server's own stats say it
  const char* kind() const noexcept override { return "node"; }
  boost::asio::awaitable<void> drain() override;
  // The server drops the namespace (protocol 2.3): its arena's and its
  // disk's objects; refused before asking a server of an older protocol.
  boost::asio::awaitable<Dropped> drop(std::uint32_t registration) override;

  // Requests turned away while no server answered, registrations a server
  // refused on a later connection (each refusal once), arenas mapped and
  // pinned, server restarts whose named arena was kept as it was (no new
  // mapping, no pinning again), and how much of the current arena is pinned.
  ServerLink server_link() const override { return session_.link(); }

 protected:
  boost::asio::awaitable<Failure> attach_registration(std::uint32_t id) override;

 private:
  struct Lease {
    std::uint32_t registration = 0;
    std::vector<kv::ChunkKey> keys;  // the hit's chunks, in order
    std::vector<std::uint64_t> offsets;
    std::vector<std::uint32_t> checkpoints;  // boundaries with an image, from keys[0]
    std::shared_ptr<ArenaMapping> arena;     // the arena the offsets are in
  };

  // A lookup or adopt reply made a lease of this process's.
  LookupResult take_lease(std::uint32_t registration, const std::vector<kv::ChunkKey>& keys,
                          proto::LookupReply& r);
  // A transfer's request bounded by its deadline; a refusal says why.
  boost::asio::awaitable<Failure> exchange(proto::Request req, Clock::time_point deadline, proto::Reply* out);

  ServerSession session_;
  std::map<std::uint64_t, Lease> leases_;  // by lease id, until a load or a release names it
};

}  // namespace kvstrand::index_plane
