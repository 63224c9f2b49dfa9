// Where a host tier's index lives: the metadata plane under HostTier's one
// data path (NIXL keeps the same split). An index plane says where objects
// are and keeps them from being evicted or rewritten while a copy uses
// them; it never moves bytes. Two implementations: LocalIndex (the size
// classes, in this process) and RemoteIndex (kvstrand-server's, over its
// protocol).
//
// Every member runs on the reactor strand. Coroutines complete with their
// outcome, never by throwing. Places handed out are ready to copy (mapped,
// and pinned where pinning is lazy).
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstddef>
#include <memory>
#include <optional>
#include <vector>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/transfer_spec.hpp>
#include "index_plane/failure.hpp"
#include "index_plane/registrations.hpp"
#include <kvstrand/hit_plan.hpp>
#include "tier/index.hpp"

namespace kvstrand::index_plane {

class IndexPlane {
 public:
  using Clock = std::chrono::steady_clock;

  // Longest run of consecutive stored chunks from keys[0], with the image
  // boundaries within it, and the lease that keeps it stored (0: none; the
  // embedded index leases nothing at lookup, its loads hold what they read).
  struct LookupResult {
    kv::HitSource hit;
    std::uint64_t lease = 0;
  };
  // The server behind the index, if any: its arena mapped here and pinned,
  // and the connection (requests turned away while no server answered,
  // connect attempts, registrations a server refused on a later
  // connection). Zeros for an index in this process.
  struct ServerLink {
    std::uint64_t mapped = 0, kept = 0, reconnects = 0;
    std::uint64_t turned_away = 0, connect_attempts = 0, refusals = 0;
    std::uint64_t arena_bytes = 0, pinned_bytes = 0;
  };

  // A save's places: objects[i] is where chunk i's object goes (nullptr: it
  // is stored already, or did not fit; `refused` counts the latter). Held
  // until commit().
  struct Places {
    Failure failure;  // the request itself failed: nothing is held
    std::vector<std::byte*> objects;
    std::uint32_t refused = 0;
    // Which chunks did not fit (the node tier's, one per key; empty where
    // the index does not say): a null object that is not refused is
    // stored already, or being written by another save.
    std::vector<bool> full;
    std::uint64_t hold = 0;          // the index's name for what it holds (0: none)
    std::shared_ptr<void> memory;    // what keeps the objects' memory mapped
  };
  // A load's objects: objects[i] holds the spec's chunk i (nullptr: the
  // index no longer has it). Held from eviction until release().
  struct Held {
    Failure failure;
    std::vector<std::byte*> objects;
    bool image_at_end = false;  // a checkpoint image is stored with the last chunk
    std::uint64_t hold = 0;
    std::shared_ptr<void> memory;
  };

  virtual ~IndexPlane() = default;

  // Attaches `reg` as registration registrations().size(), or says why
  // not (then it is not kept). One at a time: a Connector's register()
  // waits for its own.
  boost::asio::awaitable<Failure> attach(Registration reg);
  // Every registration attached, by id: the one table the levels above read.
  const Registrations& registrations() const noexcept { return registrations_; }
  virtual boost::asio::awaitable<LookupResult> lookup(std::uint32_t registration, std::vector<kv::ChunkKey> keys) = 0;
  // A lookup's lease that no load will name: free it now (F20).
  virtual boost::asio::awaitable<void> release_lookup(std::uint64_t /*lease*/) { co_return; }
  // A lease another process exported (Connector::adopt_lease): made this
  // process's, answered like a lookup of `keys`; a miss when it is gone.
  virtual boost::asio::awaitable<LookupResult> adopt(std::uint32_t /*registration*/, std::uint64_t /*lease*/,
                                                     std::vector<kv::ChunkKey> /*keys*/) {
    co_return LookupResult{};
  }
  // A lease this process exported: no longer its to release (the server
  // still ends it with this process's session, until it is adopted).
  virtual void forget_lease(std::uint64_t /*lease*/) {}
  // Drops every object of the registration's namespace (Connector::
  // invalidate): how many, or why not.
  struct Dropped {
    Failure failure;
    std::uint64_t objects = 0;
  };
  virtual boost::asio::awaitable<Dropped> drop(std::uint32_t registration) = 0;

  // Whether this process stores the registration's chunks at all (with
  // replicated_across_tp only rank 0 does, F34).
  virtual bool stores(std::uint32_t /*registration*/) const { return true; }
  // Places for the keys; images[i]: chunk i's object carries an image;
  // events: none, or chunk i's description for the tier's KV events
  // (TransferSpec::chunk_events), which only a server keeps.
  virtual boost::asio::awaitable<Places> reserve(std::uint32_t registration, const std::vector<kv::ChunkKey>& keys,
                                                 const std::vector<bool>& images,
                                                 const std::vector<std::string>& events, Clock::time_point deadline) = 0;
  // Publishes (copied) or gives back (not copied) what reserve() placed.
  virtual boost::asio::awaitable<Failure> commit(std::uint32_t registration, const std::vector<kv::ChunkKey>& keys,
                                                 const Places& places, bool copied, Clock::time_point deadline) = 0;
  // The objects of a load's keys (with its lookup's lease, if any).
  virtual boost::asio::awaitable<Held> hold(const kv::TransferSpec& spec, Clock::time_point deadline) = 0;
  // The same answer at once where no wait can be needed (the embedded
  // index), else none and hold() it is: a load then takes no coroutine
  // of its own to hold its objects (kvstrand's own share of a load,
  // bench_transfer --trace).
  virtual std::optional<Held> hold_now(const kv::TransferSpec& /*spec*/) { return std::nullopt; }
  virtual void release(const kv::TransferSpec& spec, const Held& held) = 0;

  // The memory copies go to now: kept for good when a copy on it was not
  // seen to end at the tier's destruction.
  virtual std::shared_ptr<void> memory() const = 0;
  virtual tier::Index::Stats stats() const = 0;
  virtual ServerLink server_link() const { return {}; }
  // "local" (embedded), "node" (kvstrand-server), or what a test double says.
  virtual const char* kind() const noexcept = 0;
  virtual boost::asio::awaitable<void> drain() { co_return; }

 protected:
  // This plane's own part of attaching registration `id` (already in
  // registrations(); taken out again where this fails).
  virtual boost::asio::awaitable<Failure> attach_registration(std::uint32_t id) = 0;

 private:
  Registrations registrations_;
};

}  // namespace kvstrand::index_plane
