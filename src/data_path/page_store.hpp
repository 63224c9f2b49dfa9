// kvstrand::PageStore's work (include/kvstrand/page_store.hpp): the node
// tier's index plane (RemoteIndex) on a reactor strand, and the copies of
// pages between the engine's host memory and the server's arena on the
// calling thread and a few helpers.
//
// A call takes three steps, the tier's own (HostTier's shape, without a
// device): on the strand, hold (get) or reserve (set) the objects; on the
// caller's threads, copy; on the strand, release or commit. What the
// strand gave stays mapped (the Held's or Places' memory) until the last
// step, whatever the server does meanwhile.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/thread_pool.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include <kvstrand/page_store.hpp>
#include "index_plane/index_plane.hpp"
#include "reactor/reactor.hpp"

namespace kvstrand::data_path {

class PageStore {
 public:
  using Clock = std::chrono::steady_clock;
  explicit PageStore(kvstrand::PageStoreOptions options);
  ~PageStore();

  std::uint32_t register_layout(const Registration& registration);
  std::size_t exists(std::uint32_t registration, std::span<const kv::ChunkKey> keys, bool keep_lease = true);
  std::size_t get(std::uint32_t registration, std::span<const kv::ChunkKey> keys, std::span<const std::uint32_t> pages);
  std::vector<bool> set(std::uint32_t registration, std::span<const kv::ChunkKey> keys,
                        std::span<const std::uint32_t> pages);
  std::uint64_t invalidate(std::uint32_t registration);
  kvstrand::PageStoreStats stats() const;
  void close();

 private:
  // A hit exists() leased, waiting for its get(). On the strand.
  struct Leased {
    std::uint32_t registration = 0;
    kv::ChunkKey first;
    std::uint64_t lease = 0;
    Clock::time_point until;
  };
  // The spec of pages[i] <- -> keys[i], one block per chunk.
  kv::TransferSpec spec(std::uint32_t registration, std::span<const kv::ChunkKey> keys,
                        std::span<const std::uint32_t> pages) const;
  // Copies every piece between the pages and the objects, on the caller and the helpers.
  void copy(const Registration& reg, const kv::TransferSpec& s, const std::vector<std::byte*>& objects, bool save);
  // On the strand: gives back leases past their bound (all, with `all`).
  boost::asio::awaitable<void> expire(bool all);
  // On the strand until close(): expire() every quarter bound (at most a
  // second), so that an engine gone quiet holds no lease past its bound.
  boost::asio::awaitable<void> expire_loop();
  // Registered here, and the pages in range; nothing is asked of the server otherwise.
  bool fits(std::uint32_t registration, std::span<const kv::ChunkKey> keys, std::span<const std::uint32_t> pages) const;

  kvstrand::PageStoreOptions options_;
  std::unique_ptr<reactor::Reactor> reactor_;
  std::unique_ptr<index_plane::IndexPlane> index_;
  // Registrations by id, the callers' copy (the index plane keeps its own
  // on the strand). Added rarely (at start) and read by every call from any
  // thread: one lock for both, this store's own, held only to find one.
  mutable std::mutex regs_mutex_;
  std::deque<Registration> regs_;
  std::vector<Leased> leased_;  // on the strand
  std::unique_ptr<boost::asio::thread_pool> copiers_;
  std::unique_ptr<boost::asio::steady_timer> expiry_;  // on the strand
  std::future<void> expiry_done_;
  std::atomic<bool> closed_{false};
  struct Counters {
    std::atomic<std::uint64_t> pages_read{0}, pages_written{0}, pages_existed{0}, bytes_read{0}, bytes_written{0},
        pages_not_stored{0}, calls_failed{0}, leases_expired{0};
  };
  mutable Counters counters_;
};

}  // namespace kvstrand::data_path
