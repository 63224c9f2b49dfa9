// Pins the node tier's arena for this process's device, slab by slab, in
// order, several slabs at once on helper threads (faulting pages in and
// registering them take tens of ms a GiB, which the strand must not wait
// for). A copy awaits only the prefix of the arena it needs.
//
// Owned by ServerSession; every member runs on its strand, and every
// coroutine it starts runs inside the owner's gate.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <system_error>

#include "common/gate.hpp"
#include "common/notifier.hpp"
#include "common/strand.hpp"
#include "index_plane/arena_mapping.hpp"

namespace kvstrand::index_plane {

class ArenaPinning {
 public:
  ArenaPinning(common::Strand strand, common::Gate& gate, int device)
      : strand_(std::move(strand)), gate_(gate), device_(device) {}
  // Joins the helper threads: a slab being registered is finished first.
  ~ArenaPinning() { pool_.join(); }
  ArenaPinning(const ArenaPinning&) = delete;
  ArenaPinning& operator=(const ArenaPinning&) = delete;

  // A newly mapped arena (a new server life): the old one's progress is
  // forgotten, and its slabs are pinned no further.
  void start(const ArenaMapping* current);
  // Resumes once `m` is pinned up to `end`: no error; tier_unavailable when
  // `m` is no longer the current arena or pinning has closed;
  // device_error when pinning failed (error() says why).
  boost::asio::awaitable<std::error_code> up_to(std::shared_ptr<ArenaMapping> m, std::uint64_t end);
  const std::string& error() const noexcept { return error_; }
  // Nothing more is pinned; waiters resume with `why` as the error.
  void close(std::string why);
  // Runs `f` on a helper thread (unmapping and unpinning an old arena takes
  // seconds: 7.8 s for 40 GiB on an H200).
  template <class F>
  void post(F f) {
    boost::asio::post(pool_, std::move(f));
  }

 private:
  boost::asio::awaitable<void> loop(std::shared_ptr<ArenaMapping> m);
  boost::asio::awaitable<void> pin_slab(std::shared_ptr<ArenaMapping> m, std::uint32_t slab);
  bool current(const std::shared_ptr<ArenaMapping>& m) const noexcept { return m.get() == current_; }

  static constexpr std::uint32_t kThreads = 4;
  common::Strand strand_;
  common::Gate& gate_;
  int device_;
  const ArenaMapping* current_ = nullptr;
  common::Notifier progress_{strand_};  // notified after every slab
  std::uint64_t want_ = 0;
  std::uint32_t next_ = 0;  // the next slab to start pinning
  std::uint32_t running_ = 0;
  bool pinning_ = false;
  std::string error_;
  boost::asio::thread_pool pool_{kThreads};  // last: joined before the rest goes
};

}  // namespace kvstrand::index_plane
