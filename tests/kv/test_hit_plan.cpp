// Hit capping (F8, F9): where a request resumes, from which source.
#include <catch2/catch.hpp>

#include <kvstrand/hit_plan.hpp>
#include "kv_fixtures.hpp"

using namespace kvstrand;
using kv::HitInputs;
using kv::HitSource;
using kv::NoLoad;
using kv::TokenRange;

namespace {
// Checkpoints at every chunk boundary up to `end` (what a save that carried
// every image leaves), or only at the listed boundaries.
std::vector<std::uint32_t> every_chunk(std::uint32_t end) {
  std::vector<std::uint32_t> c;
  for (std::uint32_t b = 256; b <= end; b += 256) c.push_back(b);
  return c;
}
HitSource src(std::uint32_t tokens) { return {tokens, every_chunk(tokens)}; }
}  // namespace

TEST_CASE("hit plan: table of cases", "[kv][plan]") {
  const kv::Layout state = test::reference_layout();
  const kv::Layout spec = test::with_speculation(state);
  const kv::Layout plain = test::stateless_layout();
  struct Case {
    const char* name;
    const kv::Layout* layout;
    HitInputs in;
    std::uint32_t hbm_tokens;
    std::optional<TokenRange> load;
    std::uint32_t frontier;
    NoLoad no_load;
  };
  const std::vector<Case> cases = {
      {"no hit anywhere", &state, {7097, {}, src(0), 0}, 0, std::nullopt, 0, NoLoad::not_beyond_hbm},
      {"no lookup made", &state, {7097, src(4096), std::nullopt, 0}, 4096, std::nullopt, 4096, NoLoad::no_tier_answer},
      {"the seed's workload: HBM holds the shared prefix, the tier the rest", &state,
       {7097, src(4096), src(6912), 256}, 4096, TokenRange{4096, 6912}, 6912, NoLoad::none},
      {"the tier hit is capped at the last stored checkpoint", &state,
       {7097, {}, HitSource{6912, {256, 512, 768, 1024, 4096}}, 0}, 0, TokenRange{0, 4096}, 4096, NoLoad::none},
      {"HBM KV without its checkpoint: the load starts at the HBM frontier", &state,
       {7097, HitSource{4096, {256}}, src(6912), 256}, 4096, TokenRange{4096, 6912}, 6912, NoLoad::none},
      {"HBM KV past the tier's last checkpoint, without it: the load still carries a block and the image", &state,
       {7097, HitSource{4096, {256}}, src(1024), 0}, 1008, TokenRange{1008, 1024}, 1024, NoLoad::none},
      {"HBM hit capped at its own last checkpoint when nothing is loaded", &state,
       {7097, HitSource{4000, {256, 1024, 3840}}, std::nullopt, 0}, 3840, std::nullopt, 3840, NoLoad::no_tier_answer},
      {"a tier hit not beyond HBM is not loaded", &state, {7097, src(4096), src(4096), 0}, 4096, std::nullopt, 4096,
       NoLoad::not_beyond_hbm},
      {"a tier hit below min_load_tokens past HBM is not loaded", &state, {7097, src(4096), src(4352), 512}, 4096,
       std::nullopt, 4096, NoLoad::below_min_load},
      {"exactly min_load_tokens past HBM is loaded", &state, {7097, src(4096), src(4608), 512}, 4096,
       TokenRange{4096, 4608}, 4608, NoLoad::none},
      {"F9: 1024-token prompt fully in the tier, HBM 0, min load 256", &state, {1024, {}, src(1024), 256}, 0,
       TokenRange{0, 768}, 768, NoLoad::none},
      {"F8: 1025-token prompt hitting 1024 in HBM keeps 1 token to compute", &state,
       {1025, src(1024), std::nullopt, 0}, 1024, std::nullopt, 1024, NoLoad::no_tier_answer},
      {"F8: ...and under speculative decoding it must keep 2: capped to 768", &spec,
       {1025, src(1024), std::nullopt, 0}, 768, std::nullopt, 768, NoLoad::no_tier_answer},
      {"F8: the same tail rule for a tier hit under speculative decoding", &spec, {1025, {}, src(1024), 0}, 0,
       TokenRange{0, 768}, 768, NoLoad::none},
      {"F8: 1026 tokens under speculative decoding may resume at 1024", &spec, {1026, {}, src(1024), 0}, 0,
       TokenRange{0, 1024}, 1024, NoLoad::none},
      {"stateless: HBM resumes on the block grid", &plain, {1000, HitSource{999, {}}, std::nullopt, 0}, 992,
       std::nullopt, 992, NoLoad::no_tier_answer},
      {"stateless: the tier resumes on the chunk grid, from the HBM block frontier", &plain,
       {7097, HitSource{1000, {}}, HitSource{3000, {}}, 0}, 992, TokenRange{992, 2816}, 2816, NoLoad::none},
      {"a checkpoint off the chunk grid does not count", &state, {7097, {}, HitSource{2000, {300, 512}}, 0}, 0,
       TokenRange{0, 512}, 512, NoLoad::none},
      {"prompt shorter than the tail", &state, {1, src(0), src(0), 0}, 0, std::nullopt, 0, NoLoad::not_beyond_hbm},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    const kv::HitPlan p = kv::plan_hit(*c.layout, c.in);
    REQUIRE(p.hbm_tokens == c.hbm_tokens);
    REQUIRE(p.load == c.load);
    REQUIRE(p.frontier == c.frontier);
    REQUIRE(p.no_load == c.no_load);
    // One number: where the transfer ends is where the state lands and where
    // computing resumes.
    if (p.load) {
      REQUIRE(p.load->end == p.frontier);
      REQUIRE(p.state_from_tier == c.layout->has_state());
      REQUIRE(p.hbm_tokens == p.load->begin);
    }
    REQUIRE(p.frontier + c.layout->prefill_tail() <= std::max(c.in.prompt_tokens, c.layout->prefill_tail()));
  }
}

TEST_CASE("hit plan: several groups resume where every group can (table)", "[kv][plan]") {
  // Two groups of one hybrid model, with different block sizes: a stateless
  // attention group of 16-token blocks and a stateful group of 64-token
  // blocks (checkpoints on the 256-token chunk grid).
  kv::Layout att = test::stateless_layout();
  kv::Layout swa = test::reference_layout();
  swa.block_tokens = 64;
  const kv::Layout swa16 = test::reference_layout();
  struct Group {
    const kv::Layout* layout;
    HitSource hbm;
    std::optional<HitSource> tier;
    std::uint32_t hbm_tokens;  // expected
    std::optional<TokenRange> load;
  };
  struct Case {
    const char* name;
    std::uint32_t min_load;
    std::vector<Group> groups;
    std::uint32_t frontier;
  };
  const HitSource none{};
  const std::vector<Case> cases = {
      {"both in the tier: the shorter hit is the request's",
       0,
       {{&att, none, HitSource{4096, {}}, 0, TokenRange{0, 2048}}, {&swa, none, src(2048), 0, TokenRange{0, 2048}}},
       2048},
      {"a stateless group stops at the stateful group's last checkpoint",
       0,
       {{&att, none, HitSource{6912, {}}, 0, TokenRange{0, 1024}},
        {&swa, none, HitSource{6912, {256, 512, 1024}}, 0, TokenRange{0, 1024}}},
       1024},
      {"each group's load starts at its own HBM frontier, on its own block grid",
       0,
       {{&att, HitSource{1000, {}}, HitSource{2048, {}}, 992, TokenRange{992, 2048}},
        {&swa, src(512), src(2048), 512, TokenRange{512, 2048}}},
       2048},
      {"checkpoints that never line up above 0: the groups agree on 0",
       0,
       {{&swa16, none, HitSource{1024, {256, 768}}, 0, std::nullopt},
        {&swa, none, HitSource{1024, {512, 1024}}, 0, std::nullopt}},
       0},
      {"a group without a lookup answer holds the others at its HBM frontier",
       0,
       {{&att, HitSource{300, {}}, std::nullopt, 256, std::nullopt}, {&swa, src(256), src(2048), 256, std::nullopt}},
       256},
      {"a cap that leaves a group's load under min_load_tokens: that group uses HBM, the others load to it",
       512,
       {{&att, HitSource{1792, {}}, HitSource{4096, {}}, 1024, std::nullopt},
        {&swa, none, src(1024), 0, TokenRange{0, 1024}}},
       1024},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    std::vector<kv::GroupHitInputs> in;
    for (const Group& g : c.groups) in.push_back({g.layout, g.hbm, g.tier});
    const kv::GroupsPlan p = kv::plan_groups(in, 7097, c.min_load);
    REQUIRE(p.frontier == c.frontier);
    REQUIRE(p.groups.size() == c.groups.size());
    for (std::size_t i = 0; i < c.groups.size(); ++i) {
      INFO("group " << i);
      REQUIRE(p.groups[i].frontier == c.frontier);
      REQUIRE(p.groups[i].hbm_tokens == c.groups[i].hbm_tokens);
      REQUIRE(p.groups[i].load == c.groups[i].load);
      if (p.groups[i].load) REQUIRE(p.groups[i].load->end == p.frontier);
    }
    // Never more than any group alone would resume at.
    for (const Group& g : c.groups) {
      kv::HitInputs alone{7097, g.hbm, g.tier, c.min_load};
      REQUIRE(p.frontier <= kv::plan_hit(*g.layout, alone).frontier);
    }
  }
  REQUIRE(kv::plan_groups({}, 7097, 0).frontier == 0);
}

TEST_CASE("prefill chunks end on the 256 grid, except at the prompt's end", "[kv][plan]") {
  const kv::Layout state = test::reference_layout();
  const kv::Layout plain = test::stateless_layout();
  REQUIRE(kv::prefill_chunk_end(state, 0, 2048, 7097) == 2048);
  REQUIRE(kv::prefill_chunk_end(state, 0, 2000, 7097) == 1792);       // clipped down to the grid
  REQUIRE(kv::prefill_chunk_end(state, 6912, 2048, 7097) == 7097);    // the prompt's end needs no boundary
  REQUIRE(kv::prefill_chunk_end(state, 768, 200, 7097) == 768);       // cannot reach a boundary: wait
  REQUIRE(kv::prefill_chunk_end(plain, 768, 200, 7097) == 968);       // without state it may
  REQUIRE(kv::prefill_chunk_end(state, 7097, 2048, 7097) == 7097);
  for (std::uint32_t f = 0; f < 7097;) {  // a whole prompt in budget-2000 steps: every end on the grid
    const std::uint32_t e = kv::prefill_chunk_end(state, f, 2000, 7097);
    REQUIRE(e > f);
    REQUIRE((e % 256 == 0 || e == 7097));
    f = e;
  }
}

TEST_CASE("hit plan: the largest usable checkpoint is taken whatever the order they come in", "[kv][plan]") {
  const kv::Layout state = test::reference_layout();
  // A source's checkpoints in no particular order (a union of several
  // answers), with one past the hit and one off the chunk grid among them.
  const std::vector<std::vector<std::uint32_t>> orders = {
      {256, 1024, 4096, 300, 8192}, {4096, 256, 1024, 8192, 300}, {8192, 4096, 1024, 300, 256}, {300, 8192, 4096}};
  for (const auto& cps : orders) {
    INFO(cps.size() << " checkpoints, first " << cps.front());
    REQUIRE(kv::resumable_end(state, HitSource{6912, cps}, 7000, state.chunk_tokens) == 4096);
    const kv::HitPlan p = kv::plan_hit(state, {7097, {}, HitSource{6912, cps}, 0});
    REQUIRE(p.load == TokenRange{0, 4096});
  }
}
