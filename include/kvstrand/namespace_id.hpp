// The namespace: a stable hash of everything that moves the stored bytes.
//
// Covers model id, layout name and version, planes (name, bytes per block, in
// order: the order is the object's byte layout), block and chunk tokens,
// sliding window, checkpoint spec, speculative config, dtype, TP size,
// tenant salt and, when said, the weight version. The encoding is canonical: every field is tagged and
// length-prefixed, integers are little-endian, and the speculative
// parameters are sorted by name, so reordering them does not change it.
// The TP rank is not in it: it is part of each key (chunk_keys.hpp).
#pragma once

#include <kvstrand/digest.hpp>
#include <kvstrand/layout.hpp>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand::kv {

Digest namespace_of(const Layout& layout);

}  // namespace kvstrand::kv
#pragma GCC visibility pop
