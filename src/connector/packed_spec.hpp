// A TransferSpec packed into one contiguous run of words: what submit()
// hands the strand for each transfer.
//
// The strand reads what the engine's thread wrote, and every line it reads
// must cross between their cores, and cross back when the engine's thread
// writes that memory again. A spec spreads over its own object and a buffer
// per vector, which the engine's allocator recycles into the engine's own
// code; packed, a one-chunk save is three or four lines of memory kvstrand
// keeps (in the submission ring's slot, reused from lap to lap), and the
// strand unpacks it into a spec of its own. docs/PERFORMANCE.md
// ("Step-thread cost") has the measurement.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include <kvstrand/transfer_spec.hpp>

namespace kvstrand::connector {

// The words of one packed spec: inline up to kInline (a transfer of a few
// chunks: a one-chunk save of 16 blocks is 46), in a heap buffer beyond;
// both kept for the next pack.
class PackedSpec {
 public:
  static constexpr std::size_t kInline = 120;
  std::span<const std::uint32_t> words() const noexcept {
    return {n_ <= kInline ? inline_.data() : heap_.data(), n_};
  }
  // Room for `n` words, their old contents left.
  std::uint32_t* resize(std::size_t n) {
    n_ = n;
    if (n <= kInline) return inline_.data();
    heap_.resize(n);
    return heap_.data();
  }

 private:
  std::size_t n_ = 0;
  std::array<std::uint32_t, kInline> inline_;  // only the first n_ are ever read
  std::vector<std::uint32_t> heap_;
};

// Writes `spec` over `into`.
void pack(const kv::TransferSpec& spec, PackedSpec& into);

// The spec `pack` wrote, written over `into`: every field assigned, its
// vectors' and strings' capacity kept (a reused Transfer's spec allocates
// nothing).
void unpack_into(std::span<const std::uint32_t> packed, kv::TransferSpec& into);

}  // namespace kvstrand::connector
