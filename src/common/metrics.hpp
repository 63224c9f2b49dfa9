// Prometheus metrics: counters and histograms owned by one strand (plain
// integers, no locks), one histogram the engine thread writes (relaxed
// atomics: it is a statistic, not transfer state), and the text exposition
// format they are scraped in.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kvstrand::common {

// Latency buckets, seconds: 10 us to 10 s, three per decade.
inline constexpr std::array<double, 19> kLatencyBuckets = {
    1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1, 2, 5, 10};

struct Histogram {
  std::array<std::uint64_t, kLatencyBuckets.size() + 1> buckets{};  // per bucket (not cumulative); last: +Inf
  double sum = 0;
  std::uint64_t count = 0;
  void observe(double seconds);
};

// Written by one thread (the engine's: a Connector has one), read by the
// strand. With a single writer an increment is a relaxed load and store, no
// locked read-modify-write on the step thread's path; the count is derived
// from the buckets.
class AtomicHistogram {
 public:
  void observe(double seconds) noexcept;
  Histogram snapshot() const noexcept;

 private:
  std::array<std::atomic<std::uint64_t>, kLatencyBuckets.size() + 1> buckets_{};
  std::atomic<std::uint64_t> sum_ns_{0};
};

// Counters by label set, e.g. {"kind=\"save\",outcome=\"ok\"": 12}.
using LabeledCounter = std::map<std::string, std::uint64_t>;

// The Prometheus text format, version 0.0.4.
class PromText {
 public:
  void counter(std::string_view name, std::string_view help, const LabeledCounter& values);
  void counter(std::string_view name, std::string_view help, std::uint64_t value);
  void gauge(std::string_view name, std::string_view help, double value);
  // Gauges by label set (integral values).
  void gauge(std::string_view name, std::string_view help, const LabeledCounter& values);
  void histogram(std::string_view name, std::string_view help, const Histogram& h);
  // An info gauge: always 1, what it says is in its labels (labels()).
  void info(std::string_view name, std::string_view help, std::string_view label_set);
  const std::string& str() const { return out_; }

 private:
  void head(std::string_view name, std::string_view help, std::string_view type);
  std::string out_;
};

// `a="x",b="y"` with the values escaped as the format requires.
std::string labels(std::initializer_list<std::pair<std::string_view, std::string_view>> kv);

}  // namespace kvstrand::common
