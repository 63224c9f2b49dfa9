// Where a request resumes: what it reuses from HBM, what it loads from the
// tier, and where computing starts. A pure function of what each source holds.
//
// Rules (each pinned by a test in tests/kv/test_hit_plan.cpp):
// - A hit from any source ends on a boundary whose checkpoint that source
//   holds (layouts with recurrent state); otherwise on its grid (blocks for
//   HBM, chunks for the tier).
// - At least the prefill tail is left to compute: 1 token, 2 under
//   speculative decoding. This applies to HBM hits as much as tier hits.
// - A tier hit is loaded only if it reaches at least min_load_tokens past
//   the HBM resume point.
// - A load starts at the HBM KV frontier: the blocks HBM already holds are
//   reused even when HBM lacks their checkpoint, since the load carries the
//   state image at its end. A load is never empty: when HBM holds the KV up
//   to the tier's resume point, it still moves that chunk's last block.
// - One number, `frontier`, is the physical transfer end, the state
//   destination and the resumed frontier.
#pragma once

#include <cstdint>
#include <climits>
#include <optional>
#include <vector>

#include <kvstrand/layout.hpp>
#include <kvstrand/token_range.hpp>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand::kv {

// What one source holds of this prompt, contiguously from token 0.
struct HitSource {
  std::uint32_t tokens = 0;
  // Token boundaries whose state image the source holds (any order). Only
  // boundaries on the chunk grid count.
  std::vector<std::uint32_t> checkpoints;
};

struct HitInputs {
  std::uint32_t prompt_tokens = 0;
  HitSource hbm;
  std::optional<HitSource> tier;  // none: no lookup, or the tier attempt is spent
  std::uint32_t min_load_tokens = 0;
  // No resume point past this token (several groups: where the others can
  // resume). No cap by default.
  std::uint32_t max_frontier = UINT32_MAX;
};

enum class NoLoad {
  none,                // a load is planned
  no_tier_answer,      // no lookup result
  not_beyond_hbm,      // the tier holds nothing usable past the HBM resume point
  below_min_load,      // it does, but less than min_load_tokens
};

struct HitPlan {
  std::uint32_t hbm_tokens = 0;     // KV reused in place: [0, hbm_tokens)
  std::optional<TokenRange> load;   // KV (and, at load->end, the state) from the tier
  std::uint32_t frontier = 0;       // first token to compute; state is restored at it (fresh at 0)
  bool state_from_tier = false;     // the state image arrives with the load
  NoLoad no_load = NoLoad::none;
};

// The last boundary <= limit that `src` can resume from under `layout`, on
// `grid` (block_tokens for HBM, chunk_tokens for the tier).
std::uint32_t resumable_end(const Layout& layout, const HitSource& src, std::uint32_t limit, std::uint32_t grid);

HitPlan plan_hit(const Layout& layout, const HitInputs& in);

// One KV-cache group of a request (hybrid models keep several: attention,
// sliding-window, state; speculative decoding adds a draft model's cache),
// with what each source holds of it.
struct GroupHitInputs {
  const Layout* layout = nullptr;
  HitSource hbm;
  std::optional<HitSource> tier;  // none: no lookup answer for this group
};
struct GroupsPlan {
  std::uint32_t frontier = 0;   // where every group resumes
  std::vector<HitPlan> groups;  // one per group, each with this frontier
};
// A request resumes where every group can: each group is planned by
// plan_hit's rules, capped at the least frontier the others reach, until
// they agree (the cap only falls, and 0 always agrees). So the hit is the
// least of the groups' checkpoint-capped hits, and each group's load ends
// exactly there.
GroupsPlan plan_groups(const std::vector<GroupHitInputs>& groups, std::uint32_t prompt_tokens,
                       std::uint32_t min_load_tokens);

// End of the next prefill chunk from `frontier` under a token budget: on the
// chunk grid, so every prefill chunk end of a stateful layout has a
// checkpoint, except the prompt's end. Returns `frontier` when the budget
// cannot reach the next grid point (a stateful layout then waits for a step
// with more budget; validate_budget() refuses budgets below a chunk).
std::uint32_t prefill_chunk_end(const Layout& layout, std::uint32_t frontier, std::uint32_t budget,
                                std::uint32_t prompt_tokens);

std::optional<ConfigError> validate_budget(const Layout& layout, std::uint32_t max_batched_tokens);

}  // namespace kvstrand::kv
#pragma GCC visibility pop
