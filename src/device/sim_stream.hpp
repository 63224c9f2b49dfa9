// The sim backend's device queue: a stream is a FIFO executor on its own
// host thread; copies move real bytes when the stream reaches them; an event
// completes when its stream reaches the record. Only backend_sim.cpp (the
// sim build) uses it.
//
// The locks here belong to the emulated device, not to transfer state: they
// stand in for the hardware queues a GPU runtime synchronises internally.
#pragma once

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "device/backend.hpp"
#include "device/sim_hooks.hpp"

namespace kvstrand::device::simdev {

// ---- events -------------------------------------------------------------

struct SimEvent {
  std::mutex m;
  std::condition_variable cv;
  std::uint64_t recorded = 0;   // generation of the latest record
  std::uint64_t completed = 0;  // latest generation the device reached
  Errc failure = Errc::success;  // outcome of the completed generation

  Status status_locked(const char* call) const {
    if (completed < recorded) return {Errc::not_ready, call};
    if (failure != Errc::success) return {failure, call, "sim: work before the event failed"};
    return {};
  }
};

// The handle the API sees: queued records keep the event alive past destroy,
// as a GPU runtime defers releasing an event until it completed.
struct EventBox {
  std::shared_ptr<SimEvent> ev = std::make_shared<SimEvent>();
};

// ---- streams ------------------------------------------------------------

struct Op {
  enum class Kind { copy, record, host_func, wait } kind = Kind::copy;
  std::vector<Segment> segs;
  Errc fail = Errc::success;  // injected at execution
  std::chrono::nanoseconds cost{0};  // a load path's injected cost (sim::set_load_path_cost)
  std::shared_ptr<SimEvent> ev;
  std::uint64_t gen = 0;
  void (*fn)(void*) = nullptr;
  void* arg = nullptr;
};

class SimStream {
 public:
  SimStream()
      : worker_([this] {
          pthread_setname_np(pthread_self(), "kvstrand-sim");
          run();
        }) {}
  ~SimStream() {
    {
      std::lock_guard lk(m_);
      stop_ = true;
      held_ = false;
      stopping_.store(true);
    }
    cv_.notify_all();
    worker_.join();
  }

  void push(Op op) {
    {
      std::lock_guard lk(m_);
      q_.push_back(std::move(op));
    }
    cv_.notify_all();
  }

  void synchronize() {
    std::unique_lock lk(m_);
    idle_cv_.wait(lk, [&] { return q_.empty(); });
  }
  bool idle() {
    std::lock_guard lk(m_);
    return q_.empty();
  }

  // Hooks.
  void set_delay(std::chrono::microseconds d) {
    std::lock_guard lk(m_);
    delay_ = d;
  }
  void hold(bool on) {
    {
      std::lock_guard lk(m_);
      held_ = on;
    }
    cv_.notify_all();
  }
  void fail(sim::FailAt at, Errc code, int count) {
    std::lock_guard lk(m_);
    (at == sim::FailAt::submit ? fail_submit_ : fail_execute_) = count;
    fail_code_ = code;
  }
  // Consumes one injected failure for a copy about to be submitted.
  Errc take_submit_failure() {
    std::lock_guard lk(m_);
    if (fail_submit_ == 0) return Errc::success;
    --fail_submit_;
    return fail_code_;
  }
  Errc take_execute_failure() {
    std::lock_guard lk(m_);
    if (fail_execute_ == 0) return Errc::success;
    --fail_execute_;
    return fail_code_;
  }

 private:
  void run();
  void execute(Op& op);
  // A record reached: its event completes with the failure of the copies
  // since the previous record. Lock order: the stream's, then the event's
  // (event_record takes the event's alone, before it pushes).
  void complete(Op& op);

  std::mutex m_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<Op> q_;  // deque: the front stays put while others are pushed
  bool stop_ = false;
  std::atomic<bool> stopping_{false};  // read by a wait op without the stream's lock
  bool held_ = false;
  std::chrono::microseconds delay_{0};
  int fail_submit_ = 0;
  int fail_execute_ = 0;
  Errc fail_code_ = Errc::injected_fault;
  Errc pending_failure_ = Errc::success;  // worker thread only
  std::thread worker_;  // last: starts after every member above exists
};

}  // namespace kvstrand::device::simdev
