// Where one load's time goes, step by step, from the engine's load() to
// its end taken by finished() (issue 66: kvstrand's own share of a load).
// Off unless a benchmark turns it on (bench_transfer --trace): then each
// point stamps the steady clock as a load passes it, and the benchmark,
// which runs one load at a time, reads the stamps after that load's end.
// Off, a point costs one relaxed load and a branch: no build of its own, so
// the figures are the shipped code's.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace kvstrand::common {

class LoadTrace {
 public:
  // In the order a load passes them; each on the thread named.
  enum Point : std::uint8_t {
    called,       // engine: Connector::load() entered
    returned,     // engine: load() returns (admitted, in the ring, the strand woken if asleep)
    taken,        // strand: TransferTable::start (the ring's slot read)
    running,      // strand: the transfer's coroutine runs
    held,         // strand: the index's hold answered (prepare)
    planned,      // strand: the segments planned (DeviceCopy::post entered)
    launched,     // strand: the batch queued on the stream (copy_batch returned)
    recorded,     // strand: the event after the copies recorded
    published,    // strand: the copies-queued event published to the engine
    seen,         // strand: the event seen complete, the transfer resumed
    released,     // strand: the hold released
    delivered,    // strand: the end handed to the Mailbox
    drained,      // engine: finished() returns it
    kPoints
  };

  static void enable(bool on) noexcept { on_.store(on, std::memory_order_relaxed); }
  static bool enabled() noexcept { return on_.load(std::memory_order_relaxed); }
  static void mark(Point p) noexcept {
    if (enabled()) stamps_[p].store(now_ns(), std::memory_order_relaxed);
  }
  // The stamp of `p` for the last load that passed it (0: none since clear()).
  static std::int64_t at(Point p) noexcept { return stamps_[p].load(std::memory_order_relaxed); }
  static void clear() noexcept {
    for (auto& s : stamps_) s.store(0, std::memory_order_relaxed);
  }
  static const char* name(Point p) noexcept {
    static constexpr std::array<const char*, kPoints> names = {
        "called",   "returned", "taken", "running", "held",      "planned", "launched",
        "recorded", "published", "seen", "released", "delivered", "drained"};
    return p < kPoints ? names[p] : "?";
  }
  static std::int64_t now_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

 private:
  static inline std::atomic<bool> on_{false};
  static inline std::array<std::atomic<std::int64_t>, kPoints> stamps_{};
};

}  // namespace kvstrand::common
