// A pool of ordinary events, owned by one thread (the reactor's).
//
// Creating an event costs microseconds to milliseconds on real runtimes, so
// nothing on a hot path creates one: acquire() hands out an idle event and
// only creates when none is idle. Rules this type enforces:
// - acquire(), the Lease's destructor and the pool's destructor run on the
//   owning thread (the first thread that calls acquire()); acquire() from any
//   other thread returns Errc::wrong_executor, a release from another thread
//   aborts the process rather than corrupt the pool.
// - A released event is reused, or destroyed, only after it completed: until
//   its query stops answering not_ready it waits in the retiring list. The
//   pool's destructor never waits on the device: one still pending then (a
//   stream that never finished) is left alive on purpose, and logged.
// - With max_records > 0 (interprocess events, if ever used: at most 31), an
//   event is retired after that many records instead of being reused.
#pragma once

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "device/event.hpp"

namespace kvstrand::device {

class EventPool {
 public:
  struct Options {
    std::size_t warm = 0;           // events created up front by warm_up()
    std::uint32_t max_records = 0;  // 0: unlimited (ordinary events)
  };

  struct Stats {
    std::uint64_t created = 0;
    std::uint64_t destroyed = 0;
    std::uint64_t acquired = 0;
    std::uint64_t reused = 0;
    std::uint64_t records = 0;          // total records through leases
    std::uint32_t max_records_one = 0;  // most records any one event took
    std::size_t live = 0;               // created - destroyed
    std::size_t in_use = 0;
    std::size_t idle = 0;
    std::size_t retiring = 0;  // released, not yet seen complete
  };

 private:
  struct Slot {
    Event event;
    std::uint32_t records = 0;
  };

 public:
  // One acquired event. Move-only; returns the event to the pool when it is
  // destroyed (on the owning thread).
  class Lease {
   public:
    Lease(Lease&& o) noexcept;
    Lease& operator=(Lease&& o) noexcept;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();

    Status record(Stream& s);
    Status query() const { return slot_->event.query(); }
    const Event& event() const { return slot_->event; }

   private:
    friend class EventPool;
    Lease(EventPool* pool, std::unique_ptr<Slot> slot) : pool_(pool), slot_(std::move(slot)) {}
    void release() noexcept;
    EventPool* pool_ = nullptr;
    std::unique_ptr<Slot> slot_;
  };

  EventPool();
  explicit EventPool(Options options);
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // Creates events until `options.warm` are idle. On the owning thread.
  Status warm_up();
  Result<Lease> acquire();
  // Moves completed retiring events back to idle (acquire() does this too).
  void reclaim();
  Stats stats() const;

 private:
  bool on_owner_thread();
  void take_back(std::unique_ptr<Slot> slot) noexcept;
  void destroy(std::unique_ptr<Slot> slot) noexcept;

  Options options_;
  std::thread::id owner_{};
  std::vector<std::unique_ptr<Slot>> idle_;
  std::vector<std::unique_ptr<Slot>> retiring_;
  Stats stats_{};
};

}  // namespace kvstrand::device
