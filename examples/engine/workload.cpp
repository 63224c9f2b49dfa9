#include "workload.hpp"

#include <random>

namespace kvstrand::engine {

std::uint32_t Workload::tail(std::uint32_t i) const {
  // Evenly spread over the prompts: prompt i's offset in [-spread/2, spread/2].
  const std::uint32_t k = (i * 2654435761u) % (tail_spread + 1);
  return tail_tokens - tail_spread / 2 + k;
}

std::vector<std::uint32_t> Workload::prompt(std::uint32_t i) const {
  std::vector<std::uint32_t> toks;
  toks.reserve(prefix_tokens + tail(i));
  std::mt19937 prefix_rng(static_cast<std::uint32_t>(seed * 1000 + i % prefixes));
  for (std::uint32_t t = 0; t < prefix_tokens; ++t) toks.push_back(prefix_rng() % 50'000);
  std::mt19937 tail_rng(static_cast<std::uint32_t>(seed * 1000 + 500 + i));
  for (std::uint32_t t = 0, n = tail(i); t < n; ++t) toks.push_back(tail_rng() % 50'000);
  return toks;
}

}  // namespace kvstrand::engine
