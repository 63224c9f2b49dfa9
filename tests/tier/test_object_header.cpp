// The stored-object header (src/tier/object_header): what a disk object's
// header block says, and the object checksum every node computes the same.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "tier/object_checksum.hpp"
#include "tier/object_header.hpp"

#include "object_fixtures.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

using namespace kvstrand;
using test::key;
using test::object;

TEST_CASE("object header: it says the chunk, and checks the object kept apart from it", "[tier][disk]") {
  const auto o = object(16896, 3);
  std::vector<std::byte> h(tier::kObjectHeaderBytes);
  tier::write_object_header(key(5, 2), true, o, h.data());
  auto got = tier::read_object_header(h);
  INFO(got.why());
  REQUIRE(got.has_value());
  REQUIRE(got->key == key(5, 2));
  REQUIRE(got->has_image);
  REQUIRE_FALSE(got->has_mac);
  REQUIRE(got->object_bytes == o.size());
  REQUIRE(tier::object_matches(*got, o));
  // Any changed byte of the object, or a shorter one, does not match.
  auto bad = o;
  bad[1000] ^= std::byte{1};
  REQUIRE_FALSE(tier::object_matches(*got, bad));
  REQUIRE_FALSE(tier::object_matches(*got, std::span<const std::byte>(o).first(o.size() - 1)));
  // Any changed byte of the header is refused with a reason.
  for (std::size_t at : {std::size_t{0}, std::size_t{9}, std::size_t{30}, std::size_t{70}, std::size_t{95},
                         std::size_t{121}}) {
    auto torn = h;
    torn[at] ^= std::byte{0x10};
    auto r = tier::read_object_header(torn);
    INFO("byte " << at);
    REQUIRE_FALSE(r.has_value());
    REQUIRE_FALSE(r.why().empty());
  }
  REQUIRE_FALSE(tier::read_object_header(std::span<const std::byte>(h).first(127)).has_value());
}

TEST_CASE("object header: a header of another format version is refused, even with a valid checksum", "[tier][disk]") {
  const auto o = object(4096, 1);
  std::vector<std::byte> h(tier::kObjectHeaderBytes);
  tier::write_object_header(key(1), false, o, h.data());
  h[8] = std::byte{2};  // the version
  tier::seal_object_header(h.data());
  auto r = tier::read_object_header(h);
  REQUIRE_FALSE(r.has_value());
  REQUIRE(r.why() == "format version 2");
}

TEST_CASE("object header: the object checksum is XXH3-64 whichever instructions compute it (AVX2 or not)",
          "[tier][disk]") {
  // The same value on a machine with AVX2 and one without: values written
  // by one node are checked by another.
  const auto o = object(1 << 20, 11);
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{16}, std::size_t{129}, std::size_t{240},
                        std::size_t{241}, std::size_t{1024}, std::size_t{4097}, std::size_t{65536 + 7}, o.size()})
    for (std::size_t at : {std::size_t{0}, std::size_t{1}, std::size_t{31}}) {
      if (at + n > o.size()) continue;
      INFO(n << " bytes at " << at);
      REQUIRE(tier::object_checksum(o.data() + at, n) == XXH3_64bits(o.data() + at, n));
    }
}
