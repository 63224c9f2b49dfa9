// The scheduler-to-worker lease handoff bytes: a round trip, and every way
// bytes can fail to be one (refused with why, never a crash).
#include <catch2/catch.hpp>

#include "proto/lease_handoff.hpp"

using namespace kvstrand;

namespace {
proto::LeaseHandoff sample() {
  proto::LeaseHandoff h;
  h.lease = (3ull << 48) + 17;
  for (int i = 0; i < 3; ++i) {
    kv::ChunkKey k;
    k.ns[0] = std::byte{7};
    k.kv_rank = 2;
    k.hash[0] = static_cast<std::byte>(i);
    k.hash[31] = std::byte{0xee};
    h.keys.push_back(k);
  }
  return h;
}
}  // namespace

TEST_CASE("lease handoff: bytes round-trip the lease and its keys", "[kv]") {
  const auto h = sample();
  const auto bytes = proto::encode_lease_handoff(h);
  const auto back = proto::decode_lease_handoff(bytes);
  INFO(back.why());
  REQUIRE(back);
  REQUIRE(back->lease == h.lease);
  REQUIRE(back->keys == h.keys);
}

TEST_CASE("lease handoff: truncated, overlong, foreign, other-version and empty bytes are refused, saying why",
          "[kv]") {
  const auto bytes = proto::encode_lease_handoff(sample());
  // Why `b` is refused ("" when it is not: the REQUIRE fails).
  auto why = [](std::span<const std::byte> b) {
    const auto h = proto::decode_lease_handoff(b);
    REQUIRE_FALSE(h);
    return h.why();
  };
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    INFO("first " << n << " bytes");
    REQUIRE_FALSE(proto::decode_lease_handoff(std::span(bytes.data(), n)));
  }
  auto longer = bytes;
  longer.push_back(std::byte{0});
  REQUIRE(why(longer).find("overlong") != std::string::npos);
  auto foreign = bytes;
  foreign[0] ^= std::byte{1};
  REQUIRE(why(foreign) == "not a kvstrand lease handoff");
  auto other = bytes;
  other[4] = std::byte{9};
  REQUIRE(why(other).find("version 9") != std::string::npos);
  auto none = sample();
  none.keys.clear();
  REQUIRE_FALSE(proto::decode_lease_handoff(proto::encode_lease_handoff(none)));
  none = sample();
  none.lease = 0;
  REQUIRE_FALSE(proto::decode_lease_handoff(proto::encode_lease_handoff(none)));
  // A count the rest cannot hold is refused before anything is allocated.
  auto huge = bytes;
  huge[13] = std::byte{0xff};
  huge[14] = std::byte{0xff};
  huge[15] = std::byte{0xff};
  huge[16] = std::byte{0x7f};
  REQUIRE_FALSE(proto::decode_lease_handoff(huge));
}
