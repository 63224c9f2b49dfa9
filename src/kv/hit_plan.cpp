#include <kvstrand/hit_plan.hpp>

#include <algorithm>

namespace kvstrand::kv {

std::uint32_t resumable_end(const Layout& l, const HitSource& src, std::uint32_t limit, std::uint32_t grid) {
  const std::uint32_t kv = std::min(src.tokens, limit);
  if (!l.has_state()) return floor_to(kv, grid);
  std::uint32_t best = 0;
  for (std::uint32_t c : src.checkpoints)
    if (c <= kv && c % l.chunk_tokens == 0) best = std::max(best, c);
  return best;
}

HitPlan plan_hit(const Layout& l, const HitInputs& in) {
  const std::uint32_t tail = l.prefill_tail();
  const std::uint32_t limit = std::min(in.prompt_tokens > tail ? in.prompt_tokens - tail : 0, in.max_frontier);

  HitPlan plan;
  // KV the HBM cache holds that may be reused, and where HBM alone resumes.
  const std::uint32_t hbm_kv = floor_to(std::min(in.hbm.tokens, limit), l.block_tokens);
  const std::uint32_t hbm_resume = resumable_end(l, in.hbm, limit, l.block_tokens);
  plan.hbm_tokens = hbm_resume;
  plan.frontier = hbm_resume;

  if (!in.tier) {
    plan.no_load = NoLoad::no_tier_answer;
    return plan;
  }
  const std::uint32_t tier_end = resumable_end(l, *in.tier, limit, l.chunk_tokens);
  if (tier_end <= hbm_resume) {
    plan.no_load = NoLoad::not_beyond_hbm;
    return plan;
  }
  if (tier_end - hbm_resume < in.min_load_tokens) {
    plan.no_load = NoLoad::below_min_load;
    return plan;
  }
  // From the HBM KV frontier, but never empty: a load carries the state
  // image at its end in the object of its last chunk, so it moves at least
  // that chunk's last block even when HBM holds the KV already.
  const std::uint32_t begin = std::min(hbm_kv, tier_end - l.block_tokens);
  plan.hbm_tokens = begin;
  plan.load = TokenRange{begin, tier_end};
  plan.frontier = tier_end;
  plan.state_from_tier = l.has_state();
  return plan;
}

GroupsPlan plan_groups(const std::vector<GroupHitInputs>& groups, std::uint32_t prompt_tokens,
                       std::uint32_t min_load_tokens) {
  GroupsPlan out;
  std::uint32_t cap = UINT32_MAX;
  for (;;) {
    out.groups.clear();
    std::uint32_t least = groups.empty() ? 0 : UINT32_MAX;
    for (const GroupHitInputs& g : groups) {
      HitInputs in;
      in.prompt_tokens = prompt_tokens;
      in.hbm = g.hbm;
      in.tier = g.tier;
      in.min_load_tokens = min_load_tokens;
      in.max_frontier = cap;
      out.groups.push_back(plan_hit(*g.layout, in));
      least = std::min(least, out.groups.back().frontier);
    }
    const bool agree = std::all_of(out.groups.begin(), out.groups.end(),
                                   [least](const HitPlan& p) { return p.frontier == least; });
    if (agree) {
      out.frontier = least;
      return out;
    }
    cap = least;  // below the previous cap: some group was above it
  }
}

std::uint32_t prefill_chunk_end(const Layout& l, std::uint32_t frontier, std::uint32_t budget,
                                std::uint32_t prompt_tokens) {
  if (frontier >= prompt_tokens) return frontier;
  const std::uint32_t reach = std::min(prompt_tokens, frontier + budget);
  if (reach == prompt_tokens) return reach;
  const std::uint32_t clipped = floor_to(reach, l.chunk_tokens);
  if (clipped > frontier) return clipped;
  return l.has_state() ? frontier : reach;
}

std::optional<ConfigError> validate_budget(const Layout& l, std::uint32_t max_batched_tokens) {
  if (l.has_state() && max_batched_tokens < l.chunk_tokens)
    return ConfigError{"max_num_batched_tokens",
                       "must be at least chunk_tokens (" + std::to_string(l.chunk_tokens) +
                           ") for a layout with recurrent state: prefill chunks end on checkpoint boundaries, got " +
                           std::to_string(max_batched_tokens)};
  return std::nullopt;
}

}  // namespace kvstrand::kv
