// The server protocol's encoding: every message round-trips, and every
// malformed input (truncated at any byte, trailing bytes, impossible counts,
// unknown types, another major version, oversize) is refused cleanly.
#include <catch2/catch.hpp>

#include <kvstrand/namespace_id.hpp>
#include "proto/protocol.hpp"
#include "proto/wire.hpp"
#include "kv_fixtures.hpp"

using namespace kvstrand;
using namespace kvstrand::proto;

namespace {

kv::TransferSpec spec() {
  const kv::Layout l = test::reference_layout();
  std::vector<std::uint32_t> toks(512, 7);
  kv::TransferSpec s;
  s.request = "req-42";
  s.tokens = {0, 512};
  s.keys = kv::chunk_keys(l, kv::namespace_of(l), toks);
  for (kv::BlockId b = 0; b < 32; ++b) s.blocks.push_back(b * 3);
  s.with_state = true;
  s.state_slots = {4, -1};
  return s;
}

std::vector<Request> every_request() {
  RegisterLayout reg;
  reg.layout = test::with_speculation(test::reference_layout());
  reg.layout.speculative.params = {{"a", "1"}, {"b", "2"}};
  Lookup lookup{3, spec().keys};
  Reserve reserve{3, spec().keys, {1, 0}};
  return {Hello{kMajor, 0, "engine-rank-0", {}}, reg, Unregister{3}, lookup, Release{77}, reserve, Commit{77, true},
          Commit{78, false}, EndSession{}, Stats{}, Ping{}, Adopt{3, 77, spec().keys},
          Drop{kv::namespace_of(test::reference_layout())}, DropTenant{"team-a"}};
}

std::pair<Header, std::vector<std::byte>> split(const std::vector<std::byte>& frame) {
  Header h;
  REQUIRE(decode_header(frame, kDefaultMaxBody, &h) == HeaderError::none);
  REQUIRE(h.body_bytes == frame.size() - kHeaderBytes);
  return {h, std::vector<std::byte>(frame.begin() + kHeaderBytes, frame.end())};
}

}  // namespace

TEST_CASE("protocol: every request round-trips through its frame", "[kv][protocol]") {
  for (const Request& req : every_request()) {
    INFO(to_string(type_of(req)));
    const auto frame = encode_request(req, 1234);
    auto [h, body] = split(frame);
    REQUIRE(h.request_id == 1234);
    REQUIRE(h.type == static_cast<std::uint16_t>(type_of(req)));
    auto back = decode_request(h.type, body);
    INFO(back.why());
    REQUIRE(back.has_value());
    REQUIRE(encode_request(*back, 1234) == frame);  // decoded == encoded, field for field
  }
}

TEST_CASE("protocol: a request cut short at any byte is refused, never read past", "[kv][protocol]") {
  for (const Request& req : every_request()) {
    auto [h, body] = split(encode_request(req, 1));
    for (std::size_t n = 0; n < body.size(); ++n) {
      INFO(to_string(type_of(req)) << " cut at " << n << " of " << body.size());
      const auto cut = decode_request(h.type, std::span(body).first(n));
      REQUIRE_FALSE(cut.has_value());
      REQUIRE(!cut.why().empty());
    }
    body.push_back(std::byte{0});  // and one byte too many
    const auto longer = decode_request(h.type, body);
    REQUIRE_FALSE(longer.has_value());
    // A reserve's byte after its images starts its 2.4 events, a
    // registration's after its layout its tenant, a hello's after its
    // client the 2.6 tenant it reads: cut short.
    const bool tail = type_of(req) == Type::reserve || type_of(req) == Type::register_layout ||
                      type_of(req) == Type::hello;
    REQUIRE(longer.why().find(tail ? "truncated or malformed" : "unexpected bytes") != std::string::npos);
  }
}

TEST_CASE("protocol: a registration's tenant (2.4) comes after the 2.3 layout's bytes, only when set", "[kv][protocol]") {
  RegisterLayout plain{test::reference_layout()};
  RegisterLayout named = plain;
  named.layout.tenant = "team-a";
  const auto [h, body] = split(encode_request(named, 5));
  auto back = decode_request(h.type, body);
  REQUIRE(back.has_value());
  REQUIRE(std::get<RegisterLayout>(*back).layout.tenant == "team-a");
  const auto [h23, body23] = split(encode_request(plain, 5));
  REQUIRE(body.size() == body23.size() + 4 + 6);
  REQUIRE(std::equal(body23.begin(), body23.end(), body.begin()));
  for (std::size_t n = body23.size() + 1; n < body.size(); ++n)
    REQUIRE_FALSE(decode_request(h.type, std::span(body).first(n)).has_value());
  named.layout.tenant = std::string(kv::kMaxTenantName + 1, 'a');
  const auto [hl, bl] = split(encode_request(named, 5));
  REQUIRE_FALSE(decode_request(hl.type, bl).has_value());
}

TEST_CASE("protocol: a hello's reads (2.6) comes after the client's name, only when set", "[kv][protocol]") {
  const Hello plain{kMajor, kMinor, "engine", {}};
  const Hello reader{kMajor, kMinor, "engine", "shared"};
  const auto [h, body] = split(encode_request(reader, 1));
  auto back = decode_request(h.type, body);
  REQUIRE(back.has_value());
  REQUIRE(std::get<Hello>(*back).reads == "shared");
  const auto [h25, body25] = split(encode_request(plain, 1));
  REQUIRE(body.size() == body25.size() + 4 + 6);
  REQUIRE(std::equal(body25.begin(), body25.end(), body.begin()));
  REQUIRE(std::get<Hello>(*decode_request(h25.type, body25)).reads.empty());
  for (std::size_t n = body25.size() + 1; n < body.size(); ++n)
    REQUIRE_FALSE(decode_request(h.type, std::span(body).first(n)).has_value());
  // An empty name is never sent (one encoding each), nor one too long.
  std::vector<std::byte> empty = body25;
  empty.resize(empty.size() + 4, std::byte{0});
  REQUIRE_FALSE(decode_request(h.type, empty).has_value());
  const Hello too_long{kMajor, kMinor, "engine", std::string(kv::kMaxTenantName + 1, 'a')};
  const auto [hl, bl] = split(encode_request(too_long, 1));
  REQUIRE_FALSE(decode_request(hl.type, bl).has_value());
}

TEST_CASE("protocol: a reserve's chunk events (2.4) round-trip, come after the 2.3 reserve's bytes, and are one per "
          "key or refused",
          "[kv][protocol]") {
  Reserve plain{3, spec().keys, {1, 0}};
  Reserve with = plain;
  with.events = {std::string("\x81\xac" "block_hashes" "\x91\x07", 16), std::string()};
  const auto [h, body] = split(encode_request(with, 9));
  auto back = decode_request(h.type, body);
  REQUIRE(back.has_value());
  REQUIRE(std::get<Reserve>(*back).events == with.events);
  // Without events, the bytes a 2.3 server reads, and they start the 2.4 body.
  const auto [h23, body23] = split(encode_request(plain, 9));
  REQUIRE(std::equal(body23.begin(), body23.end(), body.begin()));
  REQUIRE(std::get<Reserve>(*decode_request(h23.type, body23)).events.empty());
  // Cut anywhere inside the events: refused.
  for (std::size_t n = body23.size() + 1; n < body.size(); ++n) {
    INFO("cut at " << n << " of " << body.size());
    REQUIRE_FALSE(decode_request(h.type, std::span(body).first(n)).has_value());
  }
  Reserve fewer = plain;
  fewer.events = {"x"};  // one for two keys
  const auto [hf, bf] = split(encode_request(fewer, 9));
  REQUIRE_FALSE(decode_request(hf.type, bf).has_value());
  // An empty list after the images (fuzz_frame_decoder found it): never
  // encoded, so refused, or one reserve would have two encodings.
  proto::wire::Writer empty;
  empty.u32(3);
  empty.u32(0);  // keys
  empty.u32(0);  // images
  empty.u32(0);  // events
  REQUIRE_FALSE(decode_request(static_cast<std::uint16_t>(Type::reserve), empty.buffer()).has_value());
  Reserve huge = plain;
  huge.events = {std::string(kMaxChunkEvent + 1, 'x'), ""};
  const auto [hh, bh] = split(encode_request(huge, 9));
  REQUIRE_FALSE(decode_request(hh.type, bh).has_value());
}

TEST_CASE("protocol: impossible counts and unknown types are refused before allocating", "[kv][protocol]") {
  proto::wire::Writer w;
  w.u32(3);           // registration
  w.u32(0xffffffff);  // four billion keys in a 8-byte body
  REQUIRE_FALSE(decode_request(static_cast<std::uint16_t>(Type::lookup), w.buffer()).has_value());
  const auto unknown = decode_request(999, {});
  REQUIRE_FALSE(unknown.has_value());
  REQUIRE(unknown.why().find("unknown request type 999") != std::string::npos);
  REQUIRE_FALSE(decode_request(0, {}).has_value());
}

TEST_CASE("protocol: headers with another magic, another major version or an oversize body", "[kv][protocol]") {
  Header h;
  h.type = static_cast<std::uint16_t>(Type::ping);
  auto bytes = encode_header(h);
  Header out;
  REQUIRE(decode_header(bytes, kDefaultMaxBody, &out) == HeaderError::none);
  auto bad = bytes;
  bad[0] = std::byte{'X'};
  REQUIRE(decode_header(bad, kDefaultMaxBody, &out) == HeaderError::bad_magic);
  REQUIRE(decode_header(std::span(bytes).first(10), kDefaultMaxBody, &out) == HeaderError::bad_magic);
  h.major = 1;  // protocol 1 clients are refused
  REQUIRE(decode_header(encode_header(h), kDefaultMaxBody, &out) == HeaderError::other_major);
  h.major = kMajor;
  h.minor = 7;  // a newer minor version is compatible
  REQUIRE(decode_header(encode_header(h), kDefaultMaxBody, &out) == HeaderError::none);
  h.body_bytes = kDefaultMaxBody + 1;
  REQUIRE(decode_header(encode_header(h), kDefaultMaxBody, &out) == HeaderError::too_large);
}

TEST_CASE("protocol: replies round-trip, and errors carry their message", "[kv][protocol]") {
  LookupReply lr;
  lr.lease = 9;
  lr.hit = {768, {256, 768}};
  lr.offsets = {0, 1u << 30, 3ull << 32};
  ReserveReply rr{11, {ChunkState::reserved, ChunkState::existed, ChunkState::full}, {4096, 0, 0}};
  StatsReply sr{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<std::pair<Type, Reply>> replies = {
      {Type::hello, {Status::ok, "", HelloReply{5, kMajor, 0, 8ull << 30, 1ull << 30, 2ull << 30, true}}},
      {Type::hello, {Status::ok, "", HelloReply{5, kMajor, 2, 8ull << 30, 1ull << 30, 2ull << 30, true, 0xfeed}}},
      {Type::register_layout, {Status::ok, "", RegisterReply{3, 3700000}}},
      {Type::lookup, {Status::ok, "", lr}},
      {Type::adopt, {Status::ok, "", lr}},
      {Type::reserve, {Status::ok, "", rr}},
      {Type::stats, {Status::ok, "", sr}},
      {Type::drop, {Status::ok, "", DropReply{12, 3}}},
      {Type::ping, {Status::ok, "", Empty{}}},
      {Type::commit, {Status::unknown_hold, "no reservation 4", Empty{}}},
      {Type::reserve, {Status::over_quota, "over --max-client-reserved", Empty{}}},
      {Type::hello, {Status::refused_version, "client speaks protocol 1", Empty{}}},
  };
  for (const auto& [type, rep] : replies) {
    INFO(to_string(type) << " " << to_string(rep.status));
    const auto frame = encode_reply(type, 77, rep);
    auto [h, body] = split(frame);
    REQUIRE((h.type & kReplyBit) != 0);
    auto back = decode_reply(h.type, body);
    INFO(back.why());
    REQUIRE(back.has_value());
    REQUIRE(back->status == rep.status);
    REQUIRE(back->message == rep.message);
    REQUIRE(encode_reply(type, 77, *back) == frame);
    const bool says_id = type == Type::hello && rep.status == Status::ok && std::get<HelloReply>(rep.payload).server_id;
    for (std::size_t n = 0; n < body.size(); ++n) {
      const auto cut = decode_reply(h.type, std::span(body).first(n));
      if (says_id && n == body.size() - 8) {  // a 2.1 server's hello reply: whole, with no id
        REQUIRE(cut.has_value());
        REQUIRE(std::get<HelloReply>(cut->payload).server_id == 0);
        continue;
      }
      REQUIRE_FALSE(cut.has_value());
    }
  }
}
