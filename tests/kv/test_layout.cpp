// Layout validation: configurations kvstrand cannot serve are refused at
// start-up with the option named.
#include <catch2/catch.hpp>

#include <kvstrand/hit_plan.hpp>
#include <kvstrand/layout.hpp>
#include "kv_fixtures.hpp"

using namespace kvstrand;
using kvstrand::test::reference_layout;

TEST_CASE("layout: the reference layout is valid", "[kv][layout]") {
  REQUIRE_FALSE(kv::validate(reference_layout()).has_value());
  REQUIRE(reference_layout().bytes_per_block() == 739840);
  REQUIRE(reference_layout().object_bytes(false) == 739840ull * 16);
  REQUIRE(reference_layout().object_bytes(true) == 739840ull * 16 + (1 << 20));
}

TEST_CASE("layout: each bad option is refused by name", "[kv][layout]") {
  struct Case {
    const char* option;
    void (*mutate)(kv::Layout&);
  };
  const Case cases[] = {
      {"model_id", [](kv::Layout& l) { l.model_id.clear(); }},
      {"layout_name", [](kv::Layout& l) { l.layout_name.clear(); }},
      {"planes", [](kv::Layout& l) { l.planes.clear(); }},
      {"planes", [](kv::Layout& l) { l.planes[1].name = "kv0"; }},
      {"planes", [](kv::Layout& l) { l.planes[2].bytes_per_block = 0; }},
      {"block_tokens", [](kv::Layout& l) { l.block_tokens = 0; }},
      {"chunk_tokens", [](kv::Layout& l) { l.chunk_tokens = 250; }},
      {"chunk_tokens", [](kv::Layout& l) { l.chunk_tokens = l.checkpoint.interval_tokens = 1u << 31; }},
      {"checkpoint.interval_tokens", [](kv::Layout& l) { l.checkpoint.interval_tokens = 128; }},
      {"checkpoint.image_bytes", [](kv::Layout& l) { l.checkpoint.image_bytes = 0; }},
      {"speculative.method", [](kv::Layout& l) { l.speculative.num_tokens = 2; }},
      {"dtype", [](kv::Layout& l) { l.dtype.clear(); }},
      {"tp_rank", [](kv::Layout& l) { l.tp_rank = 4; }},
      {"tenant", [](kv::Layout& l) { l.tenant = "team a"; }},  // a space: not a metric label's name
      {"tenant", [](kv::Layout& l) { l.tenant = std::string(65, 'a'); }},
  };
  for (const Case& c : cases) {
    kv::Layout l = reference_layout();
    c.mutate(l);
    auto err = kv::validate(l);
    INFO("expected a refusal naming " << c.option);
    REQUIRE(err.has_value());
    REQUIRE(err->option == c.option);
    REQUIRE(err->describe().find(c.option) != std::string::npos);
  }
}

TEST_CASE("layout: a stateful layout refuses an override naming another layout (F16)", "[kv][layout]") {
  const kv::Layout l = reference_layout();
  REQUIRE_FALSE(kv::check_layout_override(l, "").has_value());
  REQUIRE_FALSE(kv::check_layout_override(l, "dsv41-page5").has_value());
  auto err = kv::check_layout_override(l, "plain-page5");
  REQUIRE(err.has_value());
  REQUIRE(err->option == "layout_override");
  REQUIRE(err->message.find("recurrent state") != std::string::npos);
  // A layout without recurrent state may be overridden.
  REQUIRE_FALSE(kv::check_layout_override(test::stateless_layout(), "other").has_value());
}

TEST_CASE("layout: a batch budget below one chunk is refused for stateful layouts", "[kv][layout]") {
  auto err = kv::validate_budget(reference_layout(), 128);
  REQUIRE(err.has_value());
  REQUIRE(err->option == "max_num_batched_tokens");
  REQUIRE_FALSE(kv::validate_budget(reference_layout(), 256).has_value());
  REQUIRE_FALSE(kv::validate_budget(test::stateless_layout(), 128).has_value());
}
