// The tier's last minutes, for a person: what /debug/history serves and the
// /debug page draws (hit rate, chunks loaded, saved and evicted a second,
// bytes used), so that a trend shows without a Prometheus. Sampled on the
// strand as requests come (tick()), at most every kEvery: no timer, and a
// quiet spell is one sample whose rates average over it. Fixed memory:
// kKept samples.
#pragma once

#include <boost/json/object.hpp>
#include <chrono>
#include <cstdint>
#include <deque>

#include "tier/size_classes.hpp"

namespace kvstrand::server {

class TierHistory {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr std::chrono::seconds kEvery{2};
  static constexpr std::size_t kKept = 300;  // ten minutes at kEvery

  // Samples the classes' counters (O(classes)) once kEvery has passed.
  void tick(Clock::time_point now, const tier::SizeClasses& classes);
  // Each sample against the one before it, oldest first: {"every_s",
  // "window_seconds", "window_hit_rate" (the oldest sample to the newest;
  // null without lookups), "points": [{"seconds_ago", "hit_rate" (null
  // without lookups), "loads_per_s", "saves_per_s", "evictions_per_s",
  // "used_bytes"}]}. Loads are chunks lookups hit; saves, objects committed.
  boost::json::object json(Clock::time_point now) const;

 private:
  struct Sample {
    Clock::time_point at;
    std::uint64_t asked = 0, hits = 0, committed = 0, evictions = 0, used = 0;
  };
  std::deque<Sample> samples_;  // at most kKept + 1: kKept intervals
};

}  // namespace kvstrand::server
