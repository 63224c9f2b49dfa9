// Token positions and block ids: the vocabulary shared by the planner, the
// Connector and the tiers (one set of types, no translation layer).
#pragma once

#include <cstdint>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand::kv {

using BlockId = std::uint32_t;

// [begin, end) in tokens of one request's prompt.
struct TokenRange {
  std::uint32_t begin = 0;
  std::uint32_t end = 0;

  bool empty() const noexcept { return end <= begin; }
  std::uint32_t size() const noexcept { return empty() ? 0 : end - begin; }
  friend bool operator==(const TokenRange&, const TokenRange&) = default;
};

constexpr std::uint32_t floor_to(std::uint32_t x, std::uint32_t grid) noexcept { return grid == 0 ? x : x / grid * grid; }

}  // namespace kvstrand::kv
#pragma GCC visibility pop
