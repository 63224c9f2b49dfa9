// The handoff floor: the least that handing each op to a thread of its own
// (kvstrand's reactor) and its end back costs the engine's step thread.
//
// The step thread keeps each op's spec in a slot of its own and posts the
// slot's number into a lock-free single-producer ring (kvstrand's own
// SpscRing, as its submissions and ends use); a thread that never sleeps
// while its arm runs (it stands for the reactor, which polls between the
// engine's steps) takes it, reads what a copy needs (the blocks and the key) and posts the
// slot's number back through a second ring; the step thread makes the
// outcome from its own slot. No validation, no deadline, no copy, no
// allocation after warm-up: only the cache lines that must cross between
// two cores. What the other thread reads is either
// - `in_place`: the engine's spec where it lies (its blocks and keys in
//   buffers the engine's allocator made and will reuse), or
// - `compact`: a fixed record of the slot's, which the step thread fills
//   from the spec (three cache lines, never freed).
// bench_step measures both beside kvstrand in the same run.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <vector>

#include <kvstrand/transfer_spec.hpp>
#include "reactor/spsc_ring.hpp"
#include "rest_switch.hpp"

namespace kvstrand::bench {

class HandoffFloor {
 public:
  enum class Reads { in_place, compact };
  static constexpr std::size_t kMaxBlocks = 16;  // bench_step's ops: 16 blocks, one key

  // `slots`: at most this many ops live at once (a power of two).
  HandoffFloor(std::size_t slots, Reads reads)
      : reads_(reads), ops_(slots), records_(slots), to_(slots), from_(slots), thread_([this] { loop(); }) {
    for (std::size_t i = slots; i > 0; --i) free_.push_back(static_cast<std::uint32_t>(i - 1));
  }
  ~HandoffFloor() { stop(); }
  void stop() {
    stop_.store(true, std::memory_order_relaxed);
    rest(false);
    if (thread_.joinable()) thread_.join();
  }
  // Between its arm's turns the other thread blocks instead of spinning.
  void rest(bool on) { resting_.set(on); }

  // Step thread: the spec is moved into a free slot and the slot posted.
  void post(bool save, kv::TransferSpec&& spec) {
    const std::uint32_t slot = free_.back();
    free_.pop_back();
    Op& op = ops_[slot];
    op.save = save;
    op.spec = std::move(spec);
    if (reads_ == Reads::compact) {
      Record& r = records_[slot];
      r.registration = op.spec.registration;
      r.begin = op.spec.tokens.begin;
      r.blocks = static_cast<std::uint32_t>(std::min(op.spec.blocks.size(), kMaxBlocks));
      for (std::uint32_t i = 0; i < r.blocks; ++i) r.block[i] = op.spec.blocks[i];
      r.key = op.spec.keys.front();
    }
    while (!to_.emplace([slot](std::uint32_t& s) { s = slot; })) {
    }
  }
  // Step thread: `f(save, spec)` for each op the other thread has
  // finished, its spec the step thread's own; the slot is free again after.
  template <class F>
  void drain(F f) {
    from_.consume([&](std::uint32_t slot) {
      f(ops_[slot].save, ops_[slot].spec);
      free_.push_back(slot);
    });
  }

 private:
  struct Op {
    bool save = false;
    kv::TransferSpec spec;
  };
  struct alignas(64) Record {
    std::uint32_t registration = 0, begin = 0, blocks = 0;
    kv::BlockId block[kMaxBlocks];
    kv::ChunkKey key;
  };

  void loop() {
    std::uint64_t sum = 0;  // what a copy would compute from them
    while (!stop_.load(std::memory_order_relaxed)) {
      resting_.wait();
      to_.consume([&](std::uint32_t slot) {
        if (reads_ == Reads::in_place) {
          const kv::TransferSpec& s = ops_[slot].spec;  // read where it lies, never written here
          for (kv::BlockId b : s.blocks) sum += b;
          for (const kv::ChunkKey& k : s.keys)
            sum += std::to_integer<std::uint64_t>(k.hash[0]) + s.registration + s.tokens.begin;
        } else {
          const Record& r = records_[slot];
          for (std::uint32_t i = 0; i < r.blocks; ++i) sum += r.block[i];
          sum += std::to_integer<std::uint64_t>(r.key.hash[0]) + r.registration + r.begin;
        }
        while (!from_.emplace([slot](std::uint32_t& s) { s = slot; })) {
        }
      });
    }
    sink_ = sum;
  }

  const Reads reads_;
  std::vector<Op> ops_;           // the step thread's
  std::vector<Record> records_;   // compact: written by the step thread, read by the other
  std::vector<std::uint32_t> free_;  // the step thread's
  reactor::SpscRing<std::uint32_t> to_, from_;
  std::atomic<bool> stop_{false};
  RestSwitch resting_;
  std::uint64_t sink_ = 0;
  std::thread thread_;
};

}  // namespace kvstrand::bench
