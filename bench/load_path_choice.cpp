// kvstrand's load path as measured on this host (device/load_path.hpp), for
// bench_gather to print beside its own rows: bench_gather is CUDA C++17
// and cannot include kvstrand's C++20 headers, so it calls these.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "device/load_path.hpp"
#include "device/load_path_probe.hpp"

namespace {
std::optional<kvstrand::device::LoadPaths> g_paths;
std::string g_said;
}  // namespace

// Measures (the default probe, or with these rounds and copies a round
// where they are above 0, on the current device); what it found, in one
// line, or why it could not.
extern "C" const char* kvstrand_bench_measure_load_paths(int rounds, int copies_per_round) {
  kvstrand::device::LoadPathProbeOptions o;
  if (rounds > 0) o.rounds = rounds;
  if (copies_per_round > 0) o.copies_per_round = copies_per_round;
  auto got = kvstrand::device::measure_load_paths(o);
  if (!got.ok()) {
    g_said = "not measured: " + got.status().describe();
    return g_said.c_str();
  }
  g_paths = std::move(got).value();
  g_said = g_paths->describe();
  return g_said.c_str();
}

// The path a load of these segment sizes takes (LoadPaths::path_for).
extern "C" const char* kvstrand_bench_load_path_for(const std::uint64_t* sizes, std::size_t count) {
  if (!g_paths) return "not measured";
  std::vector<kvstrand::device::Segment> segs(count);
  for (std::size_t i = 0; i < count; ++i) segs[i].bytes = sizes[i];
  return kvstrand::device::to_string(g_paths->path_for(std::span<const kvstrand::device::Segment>(segs)));
}
