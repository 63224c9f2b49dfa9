#include "common/metrics.hpp"

#include <charconv>

namespace kvstrand::common {

namespace {
std::size_t bucket_of(double seconds) {
  std::size_t i = 0;
  while (i < kLatencyBuckets.size() && seconds > kLatencyBuckets[i]) ++i;
  return i;
}
// The shortest text that reads back as the same double: a byte count stays
// whole (%.9g printed 8589934592 as 8.58993459e+09, losing bytes), 0.1 stays 0.1.
std::string number(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}
}  // namespace

void Histogram::observe(double seconds) {
  ++buckets[bucket_of(seconds)];
  sum += seconds;
  ++count;
}

void AtomicHistogram::observe(double seconds) noexcept {
  auto& b = buckets_[bucket_of(seconds)];
  b.store(b.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  sum_ns_.store(sum_ns_.load(std::memory_order_relaxed) + static_cast<std::uint64_t>(seconds * 1e9),
                std::memory_order_relaxed);
}

Histogram AtomicHistogram::snapshot() const noexcept {
  Histogram h;
  for (std::size_t i = 0; i < buckets_.size(); ++i) h.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
  h.sum = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  // The count is the buckets' sum, so a scrape racing an observe stays consistent.
  for (auto b : h.buckets) h.count += b;
  return h;
}

std::string labels(std::initializer_list<std::pair<std::string_view, std::string_view>> kv) {
  std::string out;
  for (const auto& [k, v] : kv) {
    if (!out.empty()) out += ',';
    out += k;
    out += "=\"";
    for (char c : v) {
      if (c == '\\' || c == '"') out += '\\';
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out += c;
    }
    out += '"';
  }
  return out;
}

void PromText::head(std::string_view name, std::string_view help, std::string_view type) {
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += help;
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void PromText::counter(std::string_view name, std::string_view help, const LabeledCounter& values) {
  head(name, help, "counter");
  for (const auto& [l, v] : values) {
    out_ += name;
    out_ += '{' + l + "} " + std::to_string(v) + '\n';
  }
}

void PromText::gauge(std::string_view name, std::string_view help, const LabeledCounter& values) {
  head(name, help, "gauge");
  for (const auto& [l, v] : values) {
    out_ += name;
    out_ += '{' + l + "} " + std::to_string(v) + '\n';
  }
}

void PromText::counter(std::string_view name, std::string_view help, std::uint64_t value) {
  head(name, help, "counter");
  out_ += name;
  out_ += ' ' + std::to_string(value) + '\n';
}

void PromText::gauge(std::string_view name, std::string_view help, double value) {
  head(name, help, "gauge");
  out_ += name;
  out_ += ' ' + number(value) + '\n';
}

void PromText::info(std::string_view name, std::string_view help, std::string_view label_set) {
  head(name, help, "gauge");
  out_ += name;
  out_ += '{';
  out_ += label_set;
  out_ += "} 1\n";
}

void PromText::histogram(std::string_view name, std::string_view help, const Histogram& h) {
  head(name, help, "histogram");
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < h.buckets.size(); ++i) {
    cumulative += h.buckets[i];
    out_ += name;
    out_ += "_bucket{le=\"" + (i < kLatencyBuckets.size() ? number(kLatencyBuckets[i]) : std::string("+Inf")) +
            "\"} " + std::to_string(cumulative) + '\n';
  }
  out_ += name;
  out_ += "_sum " + number(h.sum) + '\n';
  out_ += name;
  out_ += "_count " + std::to_string(h.count) + '\n';
}

}  // namespace kvstrand::common
