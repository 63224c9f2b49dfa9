// vLLM's KV event batches as kvstrand-server encodes them, in each of the
// three shapes vLLM has published (kv_event_codec.hpp), checked field by
// field with the reader; and the descriptions a server refuses. The same
// batches read by Python's msgpack, as a vLLM subscriber reads them:
// tests/python/test_server_events.py.
#include <catch2/catch.hpp>

#include <functional>
#include <string>
#include <vector>

#include "server/events/kv_event_codec.hpp"

using namespace kvstrand::server;
using namespace std::string_literals;

namespace {

std::string description(bool group) {
  msgpack::Writer w;
  w.map(group ? 5 : 4);
  w.str("block_hashes");
  w.array(2);
  w.uint(11);
  w.uint(12);
  w.str("parent_block_hash");
  w.uint(10);
  w.str("token_ids");
  w.array(1);
  w.uint(5);
  w.str("block_size");
  w.uint(16);
  if (group) {
    w.str("group_idx");
    w.uint(3);
  }
  return w.take();
}

std::string str(std::string_view s) {
  msgpack::Writer w;
  w.str(s);
  return w.take();
}

}  // namespace

TEST_CASE("events: BlockStored as a tagged array, fields in vLLM's order, trailing defaults left out",
          "[server][events]") {
  for (bool group : {false, true}) {
    INFO("group_idx " << group);
    msgpack::Writer w;
    encode_stored(w, description(group), "DISK", EventFormat::array);
    const auto items = msgpack::array_items(w.buffer());
    REQUIRE(items);
    // tag, block_hashes, parent, token_ids, block_size, lora_id, medium, lora_name[, extra_keys, group_idx]
    REQUIRE(items->size() == (group ? 10u : 8u));
    REQUIRE((*items)[0] == str("BlockStored"));
    REQUIRE((*items)[1] == "\x92\x0b\x0c"s);
    REQUIRE((*items)[2] == "\x0a"s);
    REQUIRE((*items)[3] == "\x91\x05"s);
    REQUIRE((*items)[4] == "\x10"s);
    REQUIRE(msgpack::is_nil((*items)[5]));
    REQUIRE((*items)[6] == str("DISK"));
    REQUIRE(msgpack::is_nil((*items)[7]));
    if (group) {
      REQUIRE(msgpack::is_nil((*items)[8]));  // extra_keys: None before a given group_idx
      REQUIRE((*items)[9] == "\x03"s);
    }
  }
}

TEST_CASE("events: BlockStored and BlockRemoved as tagged maps, defaults left out, and the batch's shapes",
          "[server][events]") {
  msgpack::Writer w;
  encode_stored(w, description(false), "CPU", EventFormat::map);
  auto m = msgpack::read_map(w.buffer());
  REQUIRE(m);
  std::vector<std::string_view> keys;
  for (auto& [k, v] : *m) keys.push_back(k);
  REQUIRE(keys == std::vector<std::string_view>{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size",
                                                "lora_id", "medium", "lora_name"});
  REQUIRE((*m)[6].second == str("CPU"));

  msgpack::Writer r;
  encode_removed(r, description(true), "CPU", EventFormat::events_map);
  m = msgpack::read_map(r.buffer());
  REQUIRE(m);
  REQUIRE(m->size() == 4);  // type, block_hashes, medium, group_idx
  REQUIRE((*m)[0].second == str("BlockRemoved"));
  REQUIRE((*m)[3].first == "group_idx");

  msgpack::Writer c;
  encode_cleared(c, EventFormat::array);
  REQUIRE(c.buffer() == "\x91"s + str("AllBlocksCleared"));

  const std::string events = w.buffer() + r.buffer();
  const std::string as_map = encode_batch(1.5, events, 2, EventFormat::map);
  m = msgpack::read_map(as_map);
  REQUIRE(m);
  REQUIRE(m->size() == 2);  // ts, events (data_parallel_rank: None, left out)
  REQUIRE((*m)[0].first == "ts");
  REQUIRE(msgpack::array_items((*m)[1].second)->size() == 2);
  for (EventFormat f : {EventFormat::array, EventFormat::events_map}) {
    const std::string encoded = encode_batch(1.5, events, 2, f);
    const auto batch = msgpack::array_items(encoded);
    REQUIRE(batch);
    REQUIRE(batch->size() == 2);
    REQUIRE((*batch)[0] == "\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00"s);
  }
}

TEST_CASE("events: descriptions refused, each naming why", "[server][events]") {
  REQUIRE_FALSE(description_problem(description(false)));
  msgpack::Writer none;
  none.map(1);
  none.str("block_size");
  none.uint(16);
  REQUIRE(description_problem(none.take())->find("block_hashes") != std::string::npos);
  msgpack::Writer empty;
  empty.map(2);
  empty.str("block_hashes");
  empty.array(0);
  empty.str("block_size");
  empty.uint(16);
  REQUIRE(description_problem(empty.take())->find("at least one") != std::string::npos);
  REQUIRE(description_problem("\x91\x01"s)->find("map") != std::string::npos);
  const std::string good = description(false);
  REQUIRE(description_problem(good.substr(0, good.size() - 1)));
  REQUIRE(event_format("events-map") == EventFormat::events_map);
  REQUIRE_FALSE(event_format("json"));
}

namespace {

// A description whose field `name` is replaced by `value` (or added).
std::string with_field(std::string_view name, const std::function<void(msgpack::Writer&)>& value) {
  const std::string base = description(false);
  const auto fields = *msgpack::read_map(base);
  msgpack::Writer w;
  bool found = false;
  for (const auto& [k, v] : fields) found = found || k == name;
  w.map(static_cast<std::uint32_t>(fields.size() + (found ? 0 : 1)));
  for (const auto& [k, v] : fields) {
    w.str(k);
    if (k == name) {
      value(w);
    } else {
      w.raw(v);
    }
  }
  if (!found) {
    w.str(name);
    value(w);
  }
  return w.take();
}

}  // namespace

TEST_CASE("events: a description with a field vLLM's types would refuse is refused, naming the field",
          "[server][events]") {
  // Each of these, published, makes a typed vLLM subscriber (msgspec,
  // KVEventBatch) drop the whole batch, other engines' events with it.
  const std::vector<std::pair<std::string, std::function<void(msgpack::Writer&)>>> wrong{
      {"block_hashes", [](msgpack::Writer& w) { w.array(1); w.str("h"); }},
      {"block_hashes", [](msgpack::Writer& w) { w.str("not an array"); }},
      {"parent_block_hash", [](msgpack::Writer& w) { w.str("p"); }},
      {"token_ids", [](msgpack::Writer& w) { w.str("1 2 3"); }},
      {"token_ids", [](msgpack::Writer& w) { w.array(2); w.uint(1); w.str("2"); }},
      {"block_size", [](msgpack::Writer& w) { w.str("16"); }},
      {"block_size", [](msgpack::Writer& w) { w.sint(-16); }},
      {"block_size", [](msgpack::Writer& w) { w.uint(0); }},
      {"lora_id", [](msgpack::Writer& w) { w.str("one"); }},
      {"lora_name", [](msgpack::Writer& w) { w.uint(1); }},
      {"group_idx", [](msgpack::Writer& w) { w.float64(1.5); }},
      {"extra_keys", [](msgpack::Writer& w) { w.uint(7); }},
      {"kv_cache_spec_kind", [](msgpack::Writer& w) { w.uint(1); }},
      {"kv_cache_spec_sliding_window", [](msgpack::Writer& w) { w.str("128"); }},
  };
  for (const auto& [field, value] : wrong) {
    const auto problem = description_problem(with_field(field, value));
    INFO(field);
    REQUIRE(problem);
    CHECK(problem->find(field) != std::string::npos);
  }
  // The types vLLM does use, nil where it allows None, are kept.
  const std::vector<std::pair<std::string, std::function<void(msgpack::Writer&)>>> right{
      {"block_hashes", [](msgpack::Writer& w) { w.array(2); w.raw("\xc4\x02hh"s); w.sint(-5); }},
      {"parent_block_hash", [](msgpack::Writer& w) { w.nil(); }},
      {"lora_id", [](msgpack::Writer& w) { w.nil(); }},
      {"lora_name", [](msgpack::Writer& w) { w.str("adapter"); }},
      {"extra_keys", [](msgpack::Writer& w) { w.array(1); w.array(0); }},
      {"kv_cache_spec_kind", [](msgpack::Writer& w) { w.str("sliding_window"); }},
      {"kv_cache_spec_sliding_window", [](msgpack::Writer& w) { w.uint(4096); }},
  };
  for (const auto& [field, value] : right) {
    INFO(field);
    CHECK_FALSE(description_problem(with_field(field, value)));
  }
  // Bounded in bytes: a description past kMaxDescriptionBytes is refused however well formed.
  const std::string big = with_field("token_ids", [](msgpack::Writer& w) {
    w.array(5000);
    for (int i = 0; i < 5000; ++i) w.uint(70000);
  });
  REQUIRE(big.size() > kMaxDescriptionBytes);
  REQUIRE(description_problem(big)->find("larger than") != std::string::npos);
}

TEST_CASE("events: the part of a description kept once announced says the same BlockRemoved, and no more",
          "[server][events]") {
  for (bool group : {false, true}) {
    const std::string whole = description(group);
    const auto part = removal_part(whole);
    REQUIRE(part.has_value());
    const auto m = msgpack::read_map(*part);
    REQUIRE(m.has_value());
    REQUIRE(m->size() == (group ? 2u : 1u));  // block_hashes, and group_idx where given
    CHECK((*m)[0].first == "block_hashes");
    for (EventFormat f : {EventFormat::array, EventFormat::events_map, EventFormat::map}) {
      msgpack::Writer a, b;
      encode_removed(a, whole, "CPU", f);
      encode_removed(b, *part, "CPU", f);
      CHECK(a.buffer() == b.buffer());
    }
  }
  CHECK_FALSE(removal_part("chunk 1").has_value());  // no map: nothing to keep apart
}
