// Cost of chunk keys for a long prompt: SHA-256 over (namespace, previous
// hash, 256 token ids) per chunk. Baseline in the same run: one SHA-256 over
// the same bytes in a single call, the floor for any keyed hash of them.
// Last line:  chunk keys for 131072 tokens us: p50 X p99 Y (ratio to one-shot hash Z)
//
// usage: bench_chunk_keys [tokens] [iterations]
#include <openssl/evp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/namespace_id.hpp>
#include "percentile.hpp"

using namespace kvstrand;
using kvstrand::bench::pct;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  const std::size_t tokens = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 131072;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 200;
  kv::Layout l;
  l.model_id = "bench";
  l.layout_name = "bench";
  l.planes = {{"kv", 147968}};
  l.dtype = "bf16";
  const kv::Digest ns = kv::namespace_of(l);
  std::vector<std::uint32_t> t(tokens);
  for (std::size_t i = 0; i < tokens; ++i) t[i] = static_cast<std::uint32_t>(i * 2654435761u % 151000);

  std::vector<double> keys_us, flat_us;
  std::size_t sink = 0;
  for (int i = 0; i < iterations; ++i) {
    auto t0 = Clock::now();
    auto keys = kv::chunk_keys(l, ns, t);
    auto t1 = Clock::now();
    unsigned char out[32];
    unsigned len = 0;
    EVP_Digest(t.data(), t.size() * sizeof(std::uint32_t), out, &len, EVP_sha256(), nullptr);
    auto t2 = Clock::now();
    sink += keys.size() + out[0];
    keys_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    flat_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
  }
  std::printf("bench_chunk_keys: %zu tokens, %zu chunks of %u, %d iterations (sink %zu)\n", tokens,
              tokens / l.chunk_tokens, l.chunk_tokens, iterations, sink);
  std::printf("  one-shot SHA-256 of the token bytes us: p50 %.1f p99 %.1f\n", pct(flat_us, 0.5), pct(flat_us, 0.99));
  std::printf("chunk keys for %zu tokens us: p50 %.1f p99 %.1f (ratio to one-shot hash %.2f)\n", tokens,
              pct(keys_us, 0.5), pct(keys_us, 0.99), pct(keys_us, 0.5) / pct(flat_us, 0.5));
  return 0;
}
