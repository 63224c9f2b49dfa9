// vLLM's KV event batches as kvstrand-server encodes them, in each of the
// three shapes vLLM has published (kv_event_codec.hpp), checked field by
// field with the reader; and the descriptions a server refuses. The same
// batches read by Python's msgpack, as a vLLM subscriber reads them:
// tests/python/test_server_events.py.
#include <catch2/catch.hpp>

#include <string>

#include "server/kv_event_codec.hpp"

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
