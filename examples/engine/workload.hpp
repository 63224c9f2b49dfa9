// The seed's benchmark workload and its cost model.
//
// Prompts: each is one of `prefixes` shared prefixes of `prefix_tokens`
// followed by its own tail, `tail_tokens` long on average (4096 + 3001 =
// 7097 tokens on average in the seed), spread evenly over +-tail_spread/2 so
// that requests do not finish in lockstep. A run cycles through `distinct` such prompts, so later
// passes find earlier passes' prompts in the tier, as the seed's benchmark
// did. Token ids are deterministic in (seed, prompt).
//
// Cost model (the seed's, per request): t(c) = 17.6 us x c + 91.7 ms, where c
// is the number of prompt tokens computed. Per step it is charged as
// 17.6 us per prefill token computed plus 91.7 ms / 64 per output token
// produced, so a run that is never idle reproduces it exactly.
#pragma once

#include <cstdint>
#include <vector>

namespace kvstrand::engine {

struct Workload {
  std::uint32_t prefixes = 4;
  std::uint32_t prefix_tokens = 4096;
  std::uint32_t tail_tokens = 3001;
  std::uint32_t tail_spread = 1000;
  std::uint32_t distinct = 16;
  std::uint32_t output_tokens = 64;
  std::uint64_t seed = 1;

  std::uint32_t tail(std::uint32_t i) const;
  std::uint32_t max_prompt_tokens() const { return prefix_tokens + tail_tokens + tail_spread / 2; }
  // The tokens of prompt `i` (of `distinct`).
  std::vector<std::uint32_t> prompt(std::uint32_t i) const;
};

struct CostModel {
  double us_per_prefill_token = 17.6;
  double ms_per_request = 91.7;
  std::uint32_t output_tokens = 64;

  double step_seconds(std::uint64_t prefill_tokens, std::uint64_t output_tokens_made) const {
    return (us_per_prefill_token * 1e-6) * static_cast<double>(prefill_tokens) +
           (ms_per_request * 1e-3 / output_tokens) * static_cast<double>(output_tokens_made);
  }
  // Requests per second if every request computed `c` tokens, never idle.
  double req_per_s(double c) const { return 1.0 / (us_per_prefill_token * 1e-6 * c + ms_per_request * 1e-3); }
};

}  // namespace kvstrand::engine
