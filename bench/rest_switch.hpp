// A helper thread's switch between its arm's turns in bench_step: while it
// is on, the thread blocks (no spinning), so an arm that is not taking its
// turn costs the other arms nothing.
#pragma once

#include <atomic>

namespace kvstrand::bench {

class RestSwitch {
 public:
  // Any thread: on, or off (which wakes a thread blocked in wait()).
  void set(bool on) {
    on_.store(on);
    if (!on) on_.notify_one();
  }
  // The helper thread: returns at once while off.
  void wait() const { on_.wait(true); }

 private:
  std::atomic<bool> on_{false};
};

}  // namespace kvstrand::bench
