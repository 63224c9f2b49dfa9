// The remote index plane: kvstrand-server keeps the index and the arena,
// this process maps the arena and (through HostTier) moves the bytes.
//
// All on the reactor strand:
// - attach() connects, says hello (the reply brings the server's arena, a
//   sealed memfd, which is mapped here and pinned slab by slab on helper
//   threads) and registers the layout (geometry only);
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
// uses it).
// Engine and server start in any order: a registration made while no
// server answers is kept and registered when one does (every connection
// registers them all again); until then lookups miss and saves end
// tier_unavailable. Attempts back off (kFirstBackoff doubling to
// kMaxBackoff); requests between attempts are turned away at once. A
// registration an answering server refuses is refused to the engine when
// it registers, and, when the refusal comes on a later connection (a
// server restarted with other options), runs without the tier, said once.
// With replicated_across_tp only rank 0 stores; every rank reads (F34).
#pragma once

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/thread_pool.hpp>
#include <chrono>
#include <map>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "proto/protocol.hpp"
#include "reactor/arena_mapping.hpp"
#include "reactor/arena_pinning.hpp"
#include "reactor/reactor.hpp"
#include "reactor/server_calls.hpp"
#include "common/gate.hpp"
#include "common/notifier.hpp"
#include "reactor/index_plane.hpp"

namespace kvstrand::reactor {

struct RemoteIndexOptions {
  std::string socket;
  std::chrono::milliseconds request_timeout{10'000};
  int device = 0;  // the device the arena is pinned for
  std::int64_t server_uid = -1;  // a server run by this uid is trusted too (ConnectorOptions::server_uid)
  // A published tenant to read (PageStoreOptions::reads_tenant): the arena
  // handed over is that tenant's segment, mapped read-only; nothing is stored.
  std::string reads;
};

// What a refusal's status means to the transfer that asked.
std::error_code status_error(proto::Status s);

class RemoteIndex final : public IndexPlane {
 public:
  RemoteIndex(Reactor& reactor, RemoteIndexOptions options);
  ~RemoteIndex() override;

  boost::asio::awaitable<Failure> attach(const Registration& reg) override;
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
  std::shared_ptr<void> memory() const override { return arena_; }
  tier::Index::Stats stats() const override { return {}; }  // the server's own stats say it
  const char* kind() const noexcept override { return "node"; }
  boost::asio::awaitable<void> drain() override;

  // Requests turned away while no server answered, registrations a server
  // refused on a later connection (each refusal once), arenas mapped and
  // pinned, server restarts whose named arena was kept as it was (no new
  // mapping, no pinning again), and how much of the current arena is pinned.
  ServerLink server_link() const override;

 private:
  struct Lease {
    std::uint32_t registration = 0;
    std::vector<kv::ChunkKey> keys;  // the hit's chunks, in order
    std::vector<std::uint64_t> offsets;
    std::vector<std::uint32_t> checkpoints;  // boundaries with an image, from keys[0]
    std::shared_ptr<ArenaMapping> arena;     // the arena the offsets are in
  };

  // A request's way in: connected, or turned away at once until the
  // backoff since the last attempt has passed.
  boost::asio::awaitable<Failure> ensure_connected();
  // One attempt (the handshake and every registration); a failure backs
  // the next one off.
  boost::asio::awaitable<Failure> connect_now();
  // While registrations wait for a server: attempts on the backoff's clock
  // with no request needed, so that the arena is mapped and pinned before
  // the engine's next request (an engine idle at start-up, a server
  // restarted). One loop at a time, inside the gate.
  void keep_attaching();
  boost::asio::awaitable<void> attach_in_background();
  // Connected, and `registration` taken by this server (else why not).
  boost::asio::awaitable<Failure> usable(std::uint32_t registration);

 public:
  // The server drops the namespace (protocol 2.3): its arena's and its
  // disk's objects; refused before asking a server of an older protocol.
  boost::asio::awaitable<Dropped> drop(std::uint32_t registration) override;

 private:
  boost::asio::awaitable<Failure> handshake();
  // Registers regs_[i] with the server (on a connection that said hello).
  boost::asio::awaitable<Failure> register_one(std::size_t i, Clock::time_point until);
  // A lookup or adopt reply made a lease of this process's.
  LookupResult take_lease(std::uint32_t registration, const std::vector<kv::ChunkKey>& keys,
                          proto::LookupReply& r);
  boost::asio::awaitable<Failure> hello(Clock::time_point until);
  // tier_unavailable, saying the socket path and `why` (the OS error, or what the server did).
  Failure unreachable(const std::string& why) const;
  // Releases a hold granted by the server whose arena is `of`. A hold id
  // means something only to the server that granted it: a restarted server
  // numbers its holds afresh, so an old id may name another process's hold
  // there. A hold of a server that is gone went with it: nothing is sent.
  void release_hold(std::uint64_t hold, const std::shared_ptr<ArenaMapping>& of);
  bool current(const std::shared_ptr<void>& arena) const;
  // A transfer's request bounded by its deadline; a refusal says why.
  boost::asio::awaitable<Failure> exchange(proto::Request req, Clock::time_point deadline, proto::Reply* out);
  // Ends the connection (every request on it fails with why).
  void drop_connection(const std::string& why);
  // The connection ended: attached no more, and attaching again.
  void connection_lost(const std::string& why);
  // A lookup's or reserve's reply that came after its caller gave up.
  void late_reply(const proto::Reply& r);

  // How long drain() waits for the reader, the writer and pinning to end.
  static constexpr std::chrono::milliseconds kCloseBound{1000};

  Reactor& reactor_;
  RemoteIndexOptions opt_;
  common::Gate gate_;  // every coroutine this index starts runs inside it
  std::vector<const Registration*> regs_;  // by registration id
  std::vector<Failure> refused_;            // by registration id: the server's refusal on this connection
  std::optional<std::size_t> attaching_;    // the registration attach() is registering (its refusal: thrown)
  static constexpr std::chrono::milliseconds kFirstBackoff{50};
  static constexpr std::chrono::milliseconds kMaxBackoff{2000};
  Failure down_;                            // why no server answers (empty while attached)
  std::chrono::milliseconds backoff_{0};
  Clock::time_point next_attempt_{};
  std::uint64_t turned_away_ = 0;
  std::uint64_t connect_attempts_ = 0;
  std::uint64_t refusals_ = 0;
  ServerCalls calls_;              // the current connection's requests and replies
  std::uint64_t connections_ = 0;  // attempts made (a later one that attaches is a reconnect)
  bool connected_ = false;
  bool connecting_ = false;
  bool closed_ = false;              // drain() began: no attempt starts any more
  bool attaching_in_background_ = false;
  common::Notifier connect_ended_;  // an attempt ended (connect_now), or drain() began
  std::vector<std::uint32_t> server_regs_;  // the server's id of each, on this connection
  std::uint64_t reconnects_ = 0;
  std::map<std::uint64_t, Lease> leases_;  // by lease id, until a load or a release names it
  // Holds to release once connected again (to the server that granted them).
  std::vector<std::pair<std::uint64_t, std::shared_ptr<ArenaMapping>>> unsent_releases_;
  std::shared_ptr<ArenaMapping> mapping_;  // the arena as this process mapped and pinned it
  std::shared_ptr<ArenaMapping> arena_;    // the current server life's token: an alias of mapping_
  std::uint8_t server_minor_ = 0;          // the current server's protocol minor version
  bool warned_tenant_ = false;             // a tenant not told to a 2.3 server: said once
  std::uint64_t server_id_ = 0;            // the current server life's id (0: a 2.1 server says none)
  uid_t server_uid_ = 0;                   // the connected server's user (SO_PEERCRED), a trusted one
  std::uint64_t arena_mapped_ = 0;         // arenas mapped (and pinned): one per server life but where kept
  std::uint64_t arena_kept_ = 0;           // server restarts whose named arena was kept mapped and pinned

  // Pinning of the current arena for this process's device; last: its
  // helper threads are joined before the mappings they pin go.
  ArenaPinning pinning_;
};

}  // namespace kvstrand::reactor
