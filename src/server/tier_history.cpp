#include "server/tier_history.hpp"

#include <boost/json/array.hpp>

namespace kvstrand::server {

void TierHistory::tick(Clock::time_point now, const tier::SizeClasses& classes) {
  if (!samples_.empty() && now - samples_.back().at < kEvery) return;
  const tier::Index::Stats s = classes.counters();
  samples_.push_back({now, s.lookup_asked, s.lookup_hits, s.committed, s.evictions, s.used_bytes});
  if (samples_.size() > kKept + 1) samples_.pop_front();
}

boost::json::object TierHistory::json(Clock::time_point now) const {
  boost::json::array points;
  for (std::size_t i = 1; i < samples_.size(); ++i) {
    const Sample& a = samples_[i - 1];
    const Sample& b = samples_[i];
    const double seconds = std::chrono::duration<double>(b.at - a.at).count();
    const auto per_s = [&](std::uint64_t from, std::uint64_t to) { return static_cast<double>(to - from) / seconds; };
    boost::json::object p{{"seconds_ago", std::chrono::duration<double>(now - b.at).count()},
                          {"loads_per_s", per_s(a.hits, b.hits)},
                          {"saves_per_s", per_s(a.committed, b.committed)},
                          {"evictions_per_s", per_s(a.evictions, b.evictions)},
                          {"used_bytes", b.used}};
    if (b.asked != a.asked)
      p["hit_rate"] = static_cast<double>(b.hits - a.hits) / static_cast<double>(b.asked - a.asked);
    else
      p["hit_rate"] = nullptr;
    points.push_back(std::move(p));
  }
  boost::json::object out{{"every_s", static_cast<double>(kEvery.count())}, {"window_seconds", 0.0},
                          {"window_hit_rate", nullptr}};
  if (samples_.size() > 1) {
    const Sample& a = samples_.front();
    const Sample& b = samples_.back();
    out["window_seconds"] = std::chrono::duration<double>(b.at - a.at).count();
    if (b.asked != a.asked)
      out["window_hit_rate"] = static_cast<double>(b.hits - a.hits) / static_cast<double>(b.asked - a.asked);
  }
  out["points"] = std::move(points);
  return out;
}

}  // namespace kvstrand::server
