// Namespace and chunk keys (F16, F34).
#include <catch2/catch.hpp>
#include <openssl/evp.h>

#include <cstring>
#include <numeric>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/namespace_id.hpp>
#include "kv_fixtures.hpp"

using namespace kvstrand;
using kvstrand::test::reference_layout;

namespace {
std::vector<std::uint32_t> prompt(std::size_t n, std::uint32_t seed = 1) {
  std::vector<std::uint32_t> t(n);
  for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<std::uint32_t>((i * 2654435761u) ^ seed) % 151000;
  return t;
}
}  // namespace

TEST_CASE("namespace: every field that moves the stored bytes changes it (F16)", "[kv][keys]") {
  const kv::Digest base = kv::namespace_of(reference_layout());
  REQUIRE(kv::namespace_of(reference_layout()) == base);  // stable
  struct Case {
    const char* field;
    void (*mutate)(kv::Layout&);
  };
  const Case cases[] = {
      {"model_id", [](kv::Layout& l) { l.model_id += "-v2"; }},
      {"layout_name", [](kv::Layout& l) { l.layout_name = "other"; }},
      {"layout_version", [](kv::Layout& l) { l.layout_version = 2; }},
      {"plane name", [](kv::Layout& l) { l.planes[0].name = "k"; }},
      {"plane bytes", [](kv::Layout& l) { l.planes[3].bytes_per_block += 1; }},
      {"plane order", [](kv::Layout& l) { std::swap(l.planes[0], l.planes[1]); }},
      {"plane count", [](kv::Layout& l) { l.planes.pop_back(); }},
      {"block_tokens", [](kv::Layout& l) { l.block_tokens = 32; }},
      {"chunk_tokens", [](kv::Layout& l) { l.chunk_tokens = 512; }},
      {"sliding_window", [](kv::Layout& l) { l.sliding_window = 4096; }},
      {"checkpoint kind", [](kv::Layout& l) { l.checkpoint.kind = "ring"; }},
      {"checkpoint image", [](kv::Layout& l) { l.checkpoint.image_bytes += 64; }},
      {"checkpoint interval", [](kv::Layout& l) { l.checkpoint.interval_tokens = 512; }},
      {"speculative method", [](kv::Layout& l) { l.speculative.method = "eagle"; }},
      {"speculative tokens", [](kv::Layout& l) { l.speculative.num_tokens = 3; }},
      {"speculative params", [](kv::Layout& l) { l.speculative.params = {{"draft", "x"}}; }},
      {"dtype", [](kv::Layout& l) { l.dtype = "bf16"; }},
      {"tp_size", [](kv::Layout& l) { l.tp_size = 8; }},
      {"replicated_across_tp", [](kv::Layout& l) { l.replicated_across_tp = true; }},
      {"tenant_salt", [](kv::Layout& l) { l.tenant_salt = "tenant-b"; }},
      {"weight_version", [](kv::Layout& l) { l.weight_version = "rev-2"; }},
      {"tenant", [](kv::Layout& l) { l.tenant = "team-b"; }},
  };
  for (const Case& c : cases) {
    kv::Layout l = reference_layout();
    c.mutate(l);
    INFO("field " << c.field);
    REQUIRE(kv::namespace_of(l) != base);
  }
  // The rank is not part of the namespace (it is part of the key).
  kv::Layout r = reference_layout();
  r.tp_rank = 3;
  REQUIRE(kv::namespace_of(r) == base);
}

// Namespaces outlive a client's upgrade (a node tier's arena and disk keep
// their objects): a layout that says no weight version keeps the namespace
// it had before the field existed, pinned here as that code computed it.
TEST_CASE("namespace: a layout without a weight version keeps the namespace it had before the field", "[kv][keys]") {
  REQUIRE(kv::to_hex(kv::namespace_of(reference_layout())) ==
          "87980bddca1291d815d3e76917e96645ed39c495bede1d9c35b987b8422945cb");
  kv::Layout a = reference_layout(), b = reference_layout();
  a.weight_version = "step-1000";
  b.weight_version = "step-1001";
  REQUIRE(kv::namespace_of(a) != kv::namespace_of(b));
  REQUIRE(kv::namespace_of(a) != kv::namespace_of(reference_layout()));
}

TEST_CASE("namespace: reordering the speculative parameters does not change it", "[kv][keys]") {
  kv::Layout a = test::with_speculation(reference_layout());
  kv::Layout b = a;
  a.speculative.params = {{"draft_layers", "1"}, {"accept", "greedy"}, {"temperature", "0"}};
  b.speculative.params = {{"temperature", "0"}, {"draft_layers", "1"}, {"accept", "greedy"}};
  REQUIRE(kv::namespace_of(a) == kv::namespace_of(b));
  b.speculative.params[0].second = "0.5";
  REQUIRE(kv::namespace_of(a) != kv::namespace_of(b));
}

TEST_CASE("chunk keys: only full chunks, rolling over the whole prefix", "[kv][keys]") {
  const kv::Layout l = reference_layout();
  const kv::Digest ns = kv::namespace_of(l);
  auto toks = prompt(1000);
  auto keys = kv::chunk_keys(l, ns, toks);
  REQUIRE(keys.size() == 3);  // 1000 tokens: 3 full chunks of 256, the rest has no key
  // Equal prefixes give equal keys; a change in chunk 0 changes every later key.
  auto other = toks;
  other[10] += 1;
  auto keys2 = kv::chunk_keys(l, ns, other);
  for (int i = 0; i < 3; ++i) REQUIRE(keys[i].hash != keys2[i].hash);
  auto longer = prompt(1300);
  auto keys3 = kv::chunk_keys(l, ns, longer);
  REQUIRE(keys3.size() == 5);
  for (int i = 0; i < 3; ++i) REQUIRE(keys3[i] == keys[i]);
  // A change in the last chunk only changes that chunk's key.
  auto tail = longer;
  tail[1200] += 1;
  auto keys4 = kv::chunk_keys(l, ns, tail);
  for (int i = 0; i < 4; ++i) REQUIRE(keys4[i] == keys3[i]);
  REQUIRE(keys4[4] != keys3[4]);
}

// The key is stored with every object (arena, disk, L2): an upgrade that
// hashed differently would miss everything an older build stored. So the
// definition is checked against SHA-256 computed apart, over the bytes
// namespace || previous key || the chunk's token ids (little-endian).
TEST_CASE("chunk keys: each key is SHA-256 of the namespace, the previous key and the chunk's tokens", "[kv][keys]") {
  const kv::Layout l = reference_layout();
  const kv::Digest ns = kv::namespace_of(l);
  const auto toks = prompt(3 * 256 + 17);
  const auto keys = kv::chunk_keys(l, ns, toks);
  REQUIRE(keys.size() == 3);
  kv::Digest prev{};
  for (std::size_t c = 0; c < keys.size(); ++c) {
    std::vector<unsigned char> bytes(ns.size() + prev.size() + 256 * 4);
    std::memcpy(bytes.data(), ns.data(), ns.size());
    std::memcpy(bytes.data() + 32, prev.data(), prev.size());
    std::memcpy(bytes.data() + 64, toks.data() + c * 256, 256 * 4);
    kv::Digest want{};
    unsigned len = 0;
    REQUIRE(EVP_Digest(bytes.data(), bytes.size(), reinterpret_cast<unsigned char*>(want.data()), &len, EVP_sha256(),
                       nullptr) == 1);
    CHECK(keys[c].hash == want);
    CHECK(keys[c].ns == ns);
    prev = want;
  }
}

TEST_CASE("chunk keys: incremental hashing matches hashing the whole prompt", "[kv][keys]") {
  const kv::Layout l = reference_layout();
  const kv::Digest ns = kv::namespace_of(l);
  auto toks = prompt(256 * 6);
  kv::ChunkHasher h;
  auto all = h.hashes(ns, toks, 256);
  auto first = h.hashes(ns, std::span(toks).first(512), 256);
  auto rest = h.hashes(ns, std::span(toks).subspan(512), 256, first.back());
  first.insert(first.end(), rest.begin(), rest.end());
  REQUIRE(first == all);
}

TEST_CASE("chunk keys: a tenant cannot produce another tenant's key", "[kv][keys]") {
  kv::Layout a = reference_layout(), b = reference_layout();
  a.tenant_salt = "tenant-a";
  b.tenant_salt = "tenant-b";
  auto toks = prompt(512);
  auto ka = kv::chunk_keys(a, kv::namespace_of(a), toks);
  auto kb = kv::chunk_keys(b, kv::namespace_of(b), toks);
  REQUIRE(ka[0].hash != kb[0].hash);
  REQUIRE(ka[1].hash != kb[1].hash);
}

TEST_CASE("chunk keys: TP rank collapse stores replicated state once (F34)", "[kv][keys]") {
  kv::Layout l = reference_layout();
  const auto toks = prompt(512);
  std::vector<std::uint32_t> ranks;
  int writers = 0;
  SECTION("sharded KV: one key space per rank, every rank writes") {
    for (std::uint32_t r = 0; r < l.tp_size; ++r) {
      l.tp_rank = r;
      ranks.push_back(kv::chunk_keys(l, kv::namespace_of(l), toks)[0].kv_rank);
      writers += kv::writes_to_tier(l);
    }
    REQUIRE(ranks == std::vector<std::uint32_t>{0, 1, 2, 3});
    REQUIRE(writers == 4);
  }
  SECTION("replicated KV: every rank names rank 0's object, and only rank 0 writes it") {
    l.replicated_across_tp = true;
    std::vector<kv::ChunkKey> keys;
    for (std::uint32_t r = 0; r < l.tp_size; ++r) {
      l.tp_rank = r;
      keys.push_back(kv::chunk_keys(l, kv::namespace_of(l), toks)[0]);
      writers += kv::writes_to_tier(l);
    }
    for (const auto& k : keys) REQUIRE(k == keys[0]);
    REQUIRE(keys[0].kv_rank == 0);
    REQUIRE(writers == 1);
  }
}

TEST_CASE("chunk keys: hex form of a digest", "[kv][keys]") {
  kv::Digest d{};
  d[0] = std::byte{0xab};
  d[31] = std::byte{0x01};
  const std::string hex = kv::to_hex(d);
  REQUIRE(hex.size() == 64);
  REQUIRE(hex.substr(0, 2) == "ab");
  REQUIRE(hex.substr(62) == "01");
}
