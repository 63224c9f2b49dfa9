// What one arm of the benchmark measured, as the table, the JSON file and
// the gnuplot figure show it.
#pragma once

#include <string>
#include <vector>

#include "engine.hpp"

namespace kvstrand::engine {

struct ArmSummary {
  std::string name;
  std::uint64_t requests = 0;  // finished in the measured window
  double seconds = 0;          // the measured window (modeled time)
  double req_per_s = 0;
  double ttft_avg = 0, ttft_p50 = 0, ttft_p99 = 0;  // ms
  double itl_avg = 0, itl_p50 = 0, itl_p99 = 0;     // ms
  double hbm_share = 0, tier_share = 0, recomputed_share = 0;  // of prompt tokens, %
  double ceiling_share = 0;  // the most any cache could serve, % of prompt tokens
  double computed_per_request = 0;
  double theoretical_req_per_s = 0;  // the cost model at the measured computed tokens
  std::uint64_t loads = 0, loads_from_zero = 0, loads_failed = 0, saves = 0, preemptions = 0;
  std::uint64_t resumed = 0, verified = 0, mismatches = 0;
};

ArmSummary summarize(const std::string& name, const RunStats& stats, const CostModel& cost);
void print_table(const std::vector<ArmSummary>& arms);
std::string to_json(const std::vector<ArmSummary>& arms, const std::string& config);
// Writes PNG via gnuplot; returns what happened (the path, or why not).
std::string plot(const std::vector<ArmSummary>& arms, const std::string& dir);

}  // namespace kvstrand::engine
