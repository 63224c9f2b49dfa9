// Keys for the index's tests: key(i) is chunk i of one namespace.
#pragma once

#include <kvstrand/chunk_keys.hpp>

namespace kvstrand::test {

inline kv::ChunkKey key(int i) {
  kv::ChunkKey k;
  k.hash[0] = static_cast<std::byte>(i);
  k.hash[1] = static_cast<std::byte>(i >> 8);
  return k;
}

}  // namespace kvstrand::test
