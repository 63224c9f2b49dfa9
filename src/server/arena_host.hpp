// The node tier's arena as kvstrand-server hosts it, over the server's
// life:
// - open: the arena made (a memfd) or reopened (--arena-path, its objects
//   recovered, or started empty where it cannot be read), with the
//   tenants' segments beside it (ArenaPools), the server's own mapping
//   where it reads or writes objects' bytes (--l2, --disk, --arena-path),
//   and the size classes' indexes over it;
// - growth: a filler thread populates the slabs in order, off the strand;
//   each slab's room joins the indexes on the strand once it is ready; a
//   reserve that does not fit yet waits for the next (at most kGrowWait)
//   instead of being answered `full`;
// - stop: waiters woken, the filler stopped and joined.
// Every member but the filler runs on the server's strand.
#pragma once

#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include <kvstrand/chunk_keys.hpp>

#include "common/notifier.hpp"
#include "common/strand.hpp"
#include "server/arena_pools.hpp"
#include "server/arena_recovery.hpp"
#include "server/server_options.hpp"
#include "tier/arena.hpp"
#include "tier/index.hpp"
#include "tier/object_table.hpp"
#include "tier/size_classes.hpp"

namespace kvstrand::server {

class ArenaHost {
 public:
  using Clock = std::chrono::steady_clock;

  ArenaHost(common::Strand strand, const ServerOptions& opt);
  // Stops and joins the filler.
  ~ArenaHost();
  ArenaHost(const ArenaHost&) = delete;
  ArenaHost& operator=(const ArenaHost&) = delete;

  // Makes or reopens the arena. Throws std::runtime_error naming the flag
  // (--tier-bytes, --arena-path) where it cannot be made.
  void open();
  // Populates the slabs on the filler thread; `joined` runs on the strand
  // as each slab's room joins the indexes (the disk's own slab bookkeeping).
  void start_filling(std::function<void(std::uint32_t slab)> joined);
  // No reserve waits any more (the server is stopping); the filler stops.
  void stop();
  // Joins the filler (off the strand: the server's destructor).
  void join_filler();

  // Slabs are still becoming ready, none failed, and not stopped.
  bool growing() const;
  std::uint64_t ready_bytes() const;
  // Resumes once `idx` has room for the keys it lacks, the arena stops
  // growing, `ended` is set (the session's end), or kGrowWait passed.
  boost::asio::awaitable<void> room_for(const tier::Index& idx, std::span<const kv::ChunkKey> keys, const bool& ended);

  tier::Arena& arena() { return *arena_; }
  ArenaPools& pools() { return *pools_; }
  tier::SizeClasses& classes() { return *classes_; }
  // The server's own mapping (null without --l2, --disk or --arena-path).
  std::byte* map() const noexcept { return map_; }
  const Recovery& recovery() const noexcept { return recovery_; }
  // Slabs the server's own mapping has faulted in (with --l2 or --disk).
  const std::uint32_t& mapped_slabs() const noexcept { return mapped_slabs_; }
  const std::string& fill_error() const noexcept { return fill_error_; }

 private:
  void slab_ready(std::uint32_t slab, const std::string& err);

  static constexpr std::chrono::seconds kGrowWait{1};

  common::Strand strand_;
  const ServerOptions& opt_;
  std::optional<tier::Arena> arena_;
  std::optional<ArenaPools> pools_;  // the arena and the tenants' segments (--tenant-segment)
  std::byte* map_ = nullptr;
  std::optional<tier::ObjectTable> table_;    // with --arena-path: the objects described in the arena
  std::optional<tier::SizeClasses> classes_;  // one index per object size
  Recovery recovery_;                         // what a named arena held at start
  std::function<void(std::uint32_t)> joined_;
  std::thread filler_;
  std::atomic<bool> stop_filling_{false};  // a stop signal to the filler thread, not shared state
  std::uint32_t ready_slabs_ = 0;
  std::uint32_t mapped_slabs_ = 0;
  std::string fill_error_;
  bool stopped_ = false;
  common::Notifier slab_came_;  // reserves waiting for the next slab (room_for)
  Clock::time_point started_ = Clock::now();
};

}  // namespace kvstrand::server
