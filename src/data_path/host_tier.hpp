// The one data path of the host-memory tier, over an index plane that says
// where objects are (LocalIndex in this process, RemoteIndex in
// kvstrand-server). A save or a load goes in three steps, NIXL's shape
// (prepare, post, then check):
//   prepare():  save: reserve places        load: hold the objects
//   post():     the copies queued on this tier's own stream (returns at once)
//   complete(): the copies seen to end; save: commit, load: release
// The caller (the reactor's transfer) decides between the steps: it marks
// itself pending once post() queued the copies, and skips post() once it
// no longer wants the copy (its deadline passed): complete() then gives back
// what prepare() took, and no byte is copied. Saves (D2H) and loads (H2D)
// use separate streams, so a load never queues behind saves and the two
// directions overlap on a GPU's separate copy engines.
//
// All on the reactor strand; coroutines complete with their outcome, never
// by throwing. A copy that was not seen to end leaves what its index plane
// holds for it held, and the memory it may touch mapped, for good.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "device/stream.hpp"
#include "data_path/device_copy.hpp"
#include "index_plane/failure.hpp"
#include "index_plane/index_plane.hpp"
#include "reactor/reactor.hpp"
#include <kvstrand/finished.hpp>

namespace kvstrand::data_path {

using kvstrand::TransferKind;

// What became of a save or a load. operation_canceled: the wait ended
// (shutdown) without the copy seen to end, so every buffer it references
// is left alone for good.
struct TierOutcome {
  std::error_code error;
  std::string reason;  // with error: what happened, for the engine (a save's refused chunks are counted here)

  void fail(index_plane::Failure f) {
    error = f.ec;
    reason = std::move(f.why);
  }
};

class HostTier {
 public:
  using LookupResult = index_plane::IndexPlane::LookupResult;
  using Clock = std::chrono::steady_clock;

  HostTier(reactor::Reactor& reactor, std::unique_ptr<index_plane::IndexPlane> index);
  ~HostTier();
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Adds a registration to the index plane (numbered in the order
  // attached: 0, 1, ..., as specs and lookups name them), the copy streams
  // made with the first.
  boost::asio::awaitable<index_plane::Failure> attach(Registration reg);
  // The metadata plane under this data path: lookups, leases, drops, its
  // registrations and figures go to it directly.
  index_plane::IndexPlane& index() const noexcept { return *index_; }

  // One save or load between its steps. Move-only; hand it back to
  // complete() whatever happened.
  class Copy {
   public:
    Copy(Copy&&) = default;
    // Whether post() has anything to queue (false: complete() has the
    // outcome already: a failure, or a save with nothing new to store).
    bool to_post() const noexcept { return !outcome_.error && !posted_ && has_copy_; }
    // Whether `e` (post()'s `after`) was recorded after the queued copies.
    bool recorded(const device::Event* e) const noexcept { return copy_ && copy_->recorded(e); }

   private:
    friend class HostTier;
    Copy(TransferKind k, const kv::TransferSpec& s, Clock::time_point d) : kind_(k), spec_(&s), deadline_(d) {}
    TransferKind kind_;
    const kv::TransferSpec* spec_;
    Clock::time_point deadline_;
    TierOutcome outcome_;
    bool has_copy_ = false;
    bool posted_ = false;
    std::vector<bool> images_;
    index_plane::IndexPlane::Places places_;  // a save's
    index_plane::IndexPlane::Held held_;      // a load's
    std::optional<DeviceCopy> copy_;
  };
  // Reserves (a save) or holds (a load) what the copy needs.
  boost::asio::awaitable<Copy> prepare(TransferKind kind, const kv::TransferSpec& spec, Clock::time_point deadline);
  // The same, at once, where nothing needs awaiting (a load whose index
  // answers at once: IndexPlane::hold_now); else none, and prepare() it is.
  std::optional<Copy> prepare_now(TransferKind kind, const kv::TransferSpec& spec, Clock::time_point deadline);
  // Queues the copies; returns the stream they are on (null: nothing was
  // queued, complete() says why). Never waits. `after` (a load's
  // copies-queued event, or null): recorded after the copies and awaited by
  // complete(), in place of an event from the pool (DeviceCopy::post).
  device::Stream* post(Copy& c, device::Event* after = nullptr);
  // Awaits what post() queued, then publishes (a save) or releases (a
  // load); without post(), gives back what prepare() took.
  boost::asio::awaitable<TierOutcome> complete(Copy c);

  // The streams the tier copies on, once a registration is attached (tests
  // hold them with the sim hooks).
  device::Stream* save_stream() { return save_stream_ ? &*save_stream_ : nullptr; }
  device::Stream* load_stream() { return load_stream_ ? &*load_stream_ : nullptr; }

 private:
  boost::asio::awaitable<void> prepare_save(Copy& c);
  boost::asio::awaitable<void> prepare_load(Copy& c);
  void took(Copy& c);  // a load's hold answered (c.held_): whole, or given back
  boost::asio::awaitable<TierOutcome> complete_save(Copy c);
  boost::asio::awaitable<void> save_ended(Copy& c);  // a save's copy awaited, its places committed or given back
  boost::asio::awaitable<TierOutcome> complete_load(Copy c);

  reactor::Reactor& reactor_;
  std::unique_ptr<index_plane::IndexPlane> index_;
  std::optional<device::Stream> save_stream_;
  std::optional<device::Stream> load_stream_;
  std::vector<std::shared_ptr<void>> kept_;  // memory a copy never seen to end may touch
  // The copy being posted, as segments: one buffer for every post (the
  // strand posts one at a time, and copy_batch keeps none of it).
  std::vector<device::Segment> planned_;
};

}  // namespace kvstrand::data_path
