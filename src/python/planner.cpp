// The scheduler-side planner: where a request resumes (plan_hit,
// plan_groups) and what it saves next (SaveTracker). Pure functions of their
// inputs, the same code a C++ engine calls.
#include "bindings.hpp"

#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include <kvstrand/hit_plan.hpp>
#include <kvstrand/load_outcome.hpp>
#include <kvstrand/save_tracker.hpp>
#include <kvstrand/token_range.hpp>

#include <climits>

namespace kvstrand::python {

using namespace pybind11::literals;

namespace {

std::string repr_range(const kv::TokenRange& r) {
  return "TokenRange(" + std::to_string(r.begin) + ", " + std::to_string(r.end) + ")";
}

// plan_groups' input with the layout held by value (the C++ one points at it).
struct GroupInputs {
  kv::Layout layout;
  kv::HitSource hbm;
  std::optional<kv::HitSource> tier;
};

}  // namespace

void bind_planner(py::module_& m) {
  py::class_<kv::TokenRange>(m, "TokenRange", "[begin, end) in tokens of one request's prompt.")
      .def(py::init([](std::uint32_t b, std::uint32_t e) { return kv::TokenRange{b, e}; }), "begin"_a = 0, "end"_a = 0)
      .def_readwrite("begin", &kv::TokenRange::begin)
      .def_readwrite("end", &kv::TokenRange::end)
      .def_property_readonly("empty", &kv::TokenRange::empty)
      .def("__len__", &kv::TokenRange::size)
      .def(py::self == py::self)
      .def("__hash__", [](const kv::TokenRange& r) { return (std::size_t{r.begin} << 32) | r.end; })
      .def("__repr__", &repr_range)
      .def(py::pickle([](const kv::TokenRange& r) { return py::make_tuple(r.begin, r.end); },
                      [](const py::tuple& t) {
                        return kv::TokenRange{t[0].cast<std::uint32_t>(), t[1].cast<std::uint32_t>()};
                      }));

  py::class_<kv::HitSource>(m, "HitSource", "What one source (HBM, the tier) holds of a prompt, from token 0.")
      .def(py::init([](std::uint32_t tokens, std::vector<std::uint32_t> cps) { return kv::HitSource{tokens, std::move(cps)}; }),
           "tokens"_a = 0, "checkpoints"_a = std::vector<std::uint32_t>{})
      .def_readwrite("tokens", &kv::HitSource::tokens)
      .def_readwrite("checkpoints", &kv::HitSource::checkpoints,
                     "Token boundaries whose state image the source holds (only those on the chunk grid count).")
      .def("__repr__", [](const kv::HitSource& s) {
        return "HitSource(tokens=" + std::to_string(s.tokens) + ", checkpoints=" + std::to_string(s.checkpoints.size()) +
               ")";
      });

  py::enum_<kv::NoLoad>(m, "NoLoad", "Why plan_hit planned no load.")
      .value("none", kv::NoLoad::none)
      .value("no_tier_answer", kv::NoLoad::no_tier_answer)
      .value("not_beyond_hbm", kv::NoLoad::not_beyond_hbm)
      .value("below_min_load", kv::NoLoad::below_min_load);

  py::class_<kv::HitInputs>(m, "HitInputs")
      .def(py::init([](std::uint32_t prompt, kv::HitSource hbm, std::optional<kv::HitSource> tier,
                       std::uint32_t min_load, std::uint32_t max_frontier) {
             return kv::HitInputs{prompt, std::move(hbm), std::move(tier), min_load, max_frontier};
           }),
           "prompt_tokens"_a, "hbm"_a = kv::HitSource{}, "tier"_a = py::none(), "min_load_tokens"_a = 0,
           "max_frontier"_a = UINT32_MAX)
      .def_readwrite("prompt_tokens", &kv::HitInputs::prompt_tokens)
      .def_readwrite("hbm", &kv::HitInputs::hbm)
      .def_readwrite("tier", &kv::HitInputs::tier)
      .def_readwrite("min_load_tokens", &kv::HitInputs::min_load_tokens)
      .def_readwrite("max_frontier", &kv::HitInputs::max_frontier);

  py::class_<kv::HitPlan>(m, "HitPlan",
                          "Where a request resumes: [0, hbm_tokens) reused in place, `load` from the tier (and the "
                          "state at load.end when state_from_tier), computing from `frontier`.")
      .def_readonly("hbm_tokens", &kv::HitPlan::hbm_tokens)
      .def_readonly("load", &kv::HitPlan::load)
      .def_readonly("frontier", &kv::HitPlan::frontier)
      .def_readonly("state_from_tier", &kv::HitPlan::state_from_tier)
      .def_readonly("no_load", &kv::HitPlan::no_load)
      .def("__repr__", [](const kv::HitPlan& p) {
        return "HitPlan(hbm_tokens=" + std::to_string(p.hbm_tokens) +
               ", load=" + (p.load ? repr_range(*p.load) : std::string("None")) +
               ", frontier=" + std::to_string(p.frontier) + ")";
      });

  m.def("plan_hit", &kv::plan_hit, "layout"_a, "inputs"_a,
        "Where a request resumes, by the rules in hit_plan.hpp (checkpoint-aligned, prefill tail left to compute, "
        "min_load_tokens, a load starts at the HBM frontier).");
  m.def(
      "plan_hit",
      [](const kv::Layout& l, std::uint32_t prompt, const kv::HitSource& hbm, const std::optional<kv::HitSource>& tier,
         std::uint32_t min_load, std::uint32_t max_frontier) {
        return kv::plan_hit(l, kv::HitInputs{prompt, hbm, tier, min_load, max_frontier});
      },
      "layout"_a, py::kw_only(), "prompt_tokens"_a, "hbm"_a = kv::HitSource{}, "tier"_a = py::none(),
      "min_load_tokens"_a = 0, "max_frontier"_a = UINT32_MAX);

  py::class_<GroupInputs>(m, "GroupHitInputs", "One KV-cache group of a request and what each source holds of it.")
      .def(py::init([](kv::Layout l, kv::HitSource hbm, std::optional<kv::HitSource> tier) {
             return GroupInputs{std::move(l), std::move(hbm), std::move(tier)};
           }),
           "layout"_a, "hbm"_a = kv::HitSource{}, "tier"_a = py::none())
      .def_readwrite("layout", &GroupInputs::layout)
      .def_readwrite("hbm", &GroupInputs::hbm)
      .def_readwrite("tier", &GroupInputs::tier);
  py::class_<kv::GroupsPlan>(m, "GroupsPlan")
      .def_readonly("frontier", &kv::GroupsPlan::frontier)
      .def_readonly("groups", &kv::GroupsPlan::groups);
  m.def(
      "plan_groups",
      [](const std::vector<GroupInputs>& groups, std::uint32_t prompt, std::uint32_t min_load) {
        std::vector<kv::GroupHitInputs> in;
        in.reserve(groups.size());
        for (const auto& g : groups) in.push_back(kv::GroupHitInputs{&g.layout, g.hbm, g.tier});
        return kv::plan_groups(in, prompt, min_load);
      },
      "groups"_a, "prompt_tokens"_a, "min_load_tokens"_a = 0,
      "A request resumes where every group can: each group planned by plan_hit's rules under the least frontier the "
      "others reach.");
  m.def("resumable_end", &kv::resumable_end, "layout"_a, "source"_a, "limit"_a, "grid"_a,
        "The last boundary <= limit that `source` can resume from, on `grid` (block_tokens for HBM, chunk_tokens "
        "for the tier).");
  m.def("prefill_chunk_end", &kv::prefill_chunk_end, "layout"_a, "frontier"_a, "budget"_a, "prompt_tokens"_a,
        "End of the next prefill chunk from `frontier` under a token budget, on the chunk grid.");
  m.def(
      "validate_budget",
      [](const kv::Layout& l, std::uint32_t max_batched) {
        if (auto err = kv::validate_budget(l, max_batched)) raise_config_error(err->option, err->describe());
      },
      "layout"_a, "max_batched_tokens"_a, "Raises ConfigError when a step's token budget cannot reach a chunk end.");

  py::enum_<kv::LoadOutcome>(m, "LoadOutcome", "How a planned load ended.")
      .value("landed", kv::LoadOutcome::landed)
      .value("tier_lost", kv::LoadOutcome::tier_lost)
      .value("withdrawn", kv::LoadOutcome::withdrawn)
      .value("failed", kv::LoadOutcome::failed);
  m.def("counts_as_transfer_failure", &kv::counts_as_transfer_failure, "outcome"_a);
  m.def("frees_lookup_locks_directly", &kv::frees_lookup_locks_directly, "outcome"_a,
        "True: the load never reached the tier, so its lookup's lease is released by the caller (release_lookup).");
  m.def("reopens_saves", &kv::reopens_saves, "outcome"_a);

  py::class_<kv::SaveTracker>(m, "SaveTracker",
                              "Per-request save bookkeeping on the scheduler side: which prefix the tier holds (the "
                              "frontier) and what to save next (rules in save_tracker.hpp).")
      .def(py::init<std::uint32_t>(), "chunk_tokens"_a)
      .def("note_stored", &kv::SaveTracker::note_stored, "tokens"_a)
      .def("load_decided", &kv::SaveTracker::load_decided, "load"_a)
      .def("spend_tier_attempt", &kv::SaveTracker::spend_tier_attempt)
      .def("load_settled", &kv::SaveTracker::load_settled, "outcome"_a)
      .def("next_save", &kv::SaveTracker::next_save, "committed_tokens"_a,
           "The next range to save ([frontier, committed) floored to chunks), or None.")
      .def("save_settled", &kv::SaveTracker::save_settled, "ok"_a)
      .def("abandon", &kv::SaveTracker::abandon, "end"_a)
      .def_property_readonly("frontier", &kv::SaveTracker::frontier)
      .def_property_readonly("save_floor", &kv::SaveTracker::save_floor)
      .def_property_readonly("tier_attempt_spent", &kv::SaveTracker::tier_attempt_spent)
      .def_property_readonly("loading", &kv::SaveTracker::loading)
      .def_property_readonly("save_in_flight", &kv::SaveTracker::save_in_flight);
}

}  // namespace kvstrand::python
