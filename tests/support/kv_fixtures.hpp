// Layouts used by the kv tests.
#pragma once

#include <kvstrand/layout.hpp>

namespace kvstrand::test {

// The reference geometry: 5 planes, 739,840 B per block in all; recurrent
// state checkpointed every 256 tokens.
inline kv::Layout reference_layout() {
  kv::Layout l;
  l.model_id = "deepseek-v4.1-flash";
  l.layout_name = "dsv41-page5";
  l.planes = {{"kv0", 147968}, {"kv1", 147968}, {"kv2", 147968}, {"kv3", 147968}, {"kv4", 147968}};
  l.block_tokens = 16;
  l.chunk_tokens = 256;
  l.sliding_window = 128;
  l.checkpoint = {"swa-ring+cursor", 1 << 20, 256};
  l.dtype = "fp8_e4m3";
  l.tp_size = 4;
  return l;
}

inline kv::Layout stateless_layout() {
  kv::Layout l = reference_layout();
  l.layout_name = "plain-page5";
  l.checkpoint = {};
  return l;
}

inline kv::Layout with_speculation(kv::Layout l) {
  l.speculative.method = "mtp";
  l.speculative.num_tokens = 1;
  return l;
}

}  // namespace kvstrand::test
