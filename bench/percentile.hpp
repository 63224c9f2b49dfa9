// The p-th quantile (0..1) of a sample, by nearest rank; shared by the benchmarks.
#pragma once

#include <algorithm>
#include <vector>

namespace kvstrand::bench {

inline double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(p * static_cast<double>(v.size() - 1))];
}

}  // namespace kvstrand::bench
