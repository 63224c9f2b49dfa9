// A deterministic toy model with the shape of a hybrid LLM: it writes KV for
// every token it computes and carries recurrent state (a sliding-window ring
// of the last tokens, a cursor and a running prefix hash) across tokens.
//
// Every byte is a pure function of the whole prefix: the KV of token t is
// drawn from the prefix hash after t, and the state after t holds that hash.
// So a wrong, stale or misplaced KV byte or state image changes what a
// resumed request computes next, and the comparison with a full recompute
// (ToyModel::reference) finds it. Output tokens are a function of the state.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include <kvstrand/layout.hpp>

namespace kvstrand::engine {

// The recurrent state after `cursor` tokens.
struct ToyState {
  static constexpr std::uint32_t kRing = 32;  // the sliding window
  std::uint64_t cursor = 0;
  std::uint64_t hash = 0x6b76737472616e64ull;  // "kvstrand": the empty prefix
  std::array<std::uint32_t, kRing> ring{};
  friend bool operator==(const ToyState&, const ToyState&) = default;
};

class ToyModel {
 public:
  explicit ToyModel(const kv::Layout& layout);

  // Feeds one token at position state.cursor; returns the prefix hash after it.
  static std::uint64_t advance(ToyState& s, std::uint32_t token);
  // The next output token from the state.
  static std::uint32_t next_token(const ToyState& s);

  // KV bytes of the token whose prefix hash is `h`, for plane `p`, into `out`
  // (bytes_per_token(p) bytes).
  void token_kv(std::uint64_t h, std::size_t p, std::byte* out) const;
  std::uint64_t bytes_per_token(std::size_t p) const { return per_token_[p]; }

  // The checkpoint image of a state (layout.checkpoint.image_bytes): the
  // state itself, then filler drawn from its hash, so every byte matters.
  std::vector<std::byte> image(const ToyState& s) const;
  // The state an image holds; false when it is not a valid image.
  static bool from_image(std::span<const std::byte> image, ToyState* out);

  // A full recompute of `prompt`, then `outputs` decoded tokens: the state at
  // the end of the prompt, the output tokens, and the prefix hash after each
  // prompt token (from which every KV byte follows).
  struct Reference {
    ToyState prompt_state;
    std::vector<std::uint64_t> hashes;
    std::vector<std::uint32_t> outputs;
  };
  static Reference reference(std::span<const std::uint32_t> prompt, std::uint32_t outputs);

  const kv::Layout& layout() const { return layout_; }

 private:
  kv::Layout layout_;
  std::vector<std::uint64_t> per_token_;
};

}  // namespace kvstrand::engine
