// SpscRing<T>: a bounded ring one thread writes and one other thread reads,
// without a lock.
//
// The engine's thread hands submissions to the strand through one
// (HandoffQueue), and the strand each transfer's end back through another
// (Mailbox): a push is a write into the slot and one store, a drain one load
// and one store, so the step thread's finished() takes no lock. (Measured
// no faster than the mutex it replaced: the ends' lines cross either way;
// docs/PERFORMANCE.md, "Step-thread cost".)
//
// An item is read where it lies and left in its slot: the producer writes
// over it when the slot comes round again, so what the consumer did not take
// out (a string's buffer) stays with the thread that allocated it.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <limits>
#include <vector>

namespace kvstrand::reactor {

template <class T>
class SpscRing {
 public:
  // `capacity` is rounded up to a power of two.
  explicit SpscRing(std::size_t capacity) : slots_(round_up(capacity)), mask_(slots_.size() - 1) {}

  std::size_t capacity() const noexcept { return slots_.size(); }

  // Producer. True: `fill(slot)` has written the next item over what that
  // slot held before (a consumed item, or T{}) and the item is published.
  // False (and `fill` not called) when the ring is full.
  template <class Fill>
  bool emplace(Fill&& fill) {
    const std::size_t t = tail_.load(std::memory_order_relaxed);
    // The consumer's head is read only when the last one read says full:
    // its line is the consumer's, and reading it on every push was a miss.
    if (t - head_seen_ > mask_ && t - (head_seen_ = head_.load(std::memory_order_acquire)) > mask_) return false;
    fill(slots_[t & mask_]);
    tail_.store(t + 1, std::memory_order_release);
    return true;
  }

  // Producer: asks for the first `bytes` of each of the next `n` free
  // slots to be brought to this core for writing, so the misses on lines
  // the consumer last held overlap the producer's other work instead of
  // each push waiting for its own.
  void prefetch_for_write(std::size_t n, std::size_t bytes) const noexcept {
    const std::size_t t = tail_.load(std::memory_order_relaxed);
    n = std::min(n, capacity() - (t - head_seen_));
    for (std::size_t i = 0; i < n; ++i) {
      const char* p = reinterpret_cast<const char*>(&slots_[(t + i) & mask_]);
      for (std::size_t b = 0; b < bytes; b += 64) prefetch_line_for_write(p + b);
    }
  }

  // Producer: the index the next item pushed will have (items are numbered
  // from 0 in push order).
  std::size_t next_index() const noexcept { return tail_.load(std::memory_order_relaxed); }
  // Producer: how many items the consumer has taken and given back; those
  // numbered below it are done with, the consumer's f returned for each.
  std::size_t consumed() const noexcept { return head_.load(std::memory_order_acquire); }

  // Producer: a full fence after everything published so far, ordered
  // with the tail (a sequentially consistent read-modify-write of it: TSan
  // understands it, atomic_thread_fence it does not). The producer's half
  // of a sleep handshake (HandoffQueue).
  void fence_published() noexcept { tail_.fetch_add(0, std::memory_order_seq_cst); }

  // Consumer: whether no item is waiting (one load of the tail, with
  // `order`; a push racing it is seen by the next call).
  bool empty(std::memory_order order = std::memory_order_acquire) const noexcept {
    return tail_.load(order) == head_.load(std::memory_order_relaxed);
  }

  // Consumer: f(const T&) for each item waiting, in order, at most `max`,
  // leaving them in the ring; returns how many.
  template <class F>
  std::size_t peek(F f, std::size_t max = std::numeric_limits<std::size_t>::max()) const {
    const std::size_t h = head_.load(std::memory_order_relaxed);
    const std::size_t t = tail_.load(std::memory_order_acquire);
    std::size_t n = 0;
    for (; n < t - h && n < max; ++n) f(static_cast<const T&>(slots_[(h + n) & mask_]));
    return n;
  }

  // Consumer: f(T&) for each item waiting, in order, at most `max`, each
  // slot given back to the producer once f returns (or throws: that item
  // is not handed out again); returns how many.
  template <class F>
  std::size_t consume(F f, std::size_t max = std::numeric_limits<std::size_t>::max()) {
    const std::size_t first = head_.load(std::memory_order_relaxed);
    const std::size_t t = tail_.load(std::memory_order_acquire);
    // One store at the end, however it ends: the producer reads this line
    // on every push, and a store per item would pull it back each time.
    struct Release {
      std::atomic<std::size_t>& head;
      std::size_t next;
      ~Release() { head.store(next, std::memory_order_release); }
    } release{head_, first};
    while (release.next != t && release.next - first < max) f(slots_[release.next++ & mask_]);
    return release.next - first;
  }

 private:
  // Without -march, GCC lowers __builtin_prefetch(p, 1) to a read prefetch
  // on x86-64: the line then arrives shared and the write still waits for
  // it to be made exclusive. PREFETCHW asks for it exclusive (a no-op on
  // processors older than it).
  static void prefetch_line_for_write(const char* p) noexcept {
#if defined(__x86_64__)
    asm volatile("prefetchw %0" : : "m"(*p));
#else
    __builtin_prefetch(p, 1);
#endif
  }

  static std::size_t round_up(std::size_t n) {
    std::size_t c = 1;
    while (c < n) c <<= 1;
    return c;
  }

  std::vector<T> slots_;
  const std::size_t mask_;
  // Apart, so the producer's and the consumer's stores do not share a line.
  alignas(64) std::atomic<std::size_t> tail_{0};  // written by the producer
  std::size_t head_seen_ = 0;                      // the producer's last read of head_
  alignas(64) std::atomic<std::size_t> head_{0};  // written by the consumer
};

}  // namespace kvstrand::reactor
