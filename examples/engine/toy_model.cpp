#include "toy_model.hpp"

#include <cstring>
#include <stdexcept>

namespace kvstrand::engine {

namespace {

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

void fill(std::uint64_t seed, std::byte* out, std::size_t n) {
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    seed = splitmix(seed);
    std::memcpy(out + i, &seed, 8);
  }
  seed = splitmix(seed);
  for (; i < n; ++i) out[i] = static_cast<std::byte>(seed >> (8 * (i % 8)));
}

constexpr std::uint64_t kMagic = 0x544f59535441544full;  // "TOYSTATO"

}  // namespace

ToyModel::ToyModel(const kv::Layout& layout) : layout_(layout) {
  for (const auto& p : layout.planes) {
    if (p.bytes_per_block % layout.block_tokens != 0)
      throw std::invalid_argument("plane '" + p.name + "': bytes_per_block is not a multiple of block_tokens");
    per_token_.push_back(p.bytes_per_block / layout.block_tokens);
  }
  if (layout.has_state() && layout.checkpoint.image_bytes < sizeof(ToyState) + 8)
    throw std::invalid_argument("checkpoint image_bytes is smaller than the toy state");
}

std::uint64_t ToyModel::advance(ToyState& s, std::uint32_t token) {
  s.hash = splitmix(s.hash ^ (static_cast<std::uint64_t>(token) * 0x100000001b3ull) ^ (s.cursor << 40));
  s.ring[s.cursor % ToyState::kRing] = token;
  ++s.cursor;
  return s.hash;
}

std::uint32_t ToyModel::next_token(const ToyState& s) {
  std::uint64_t x = s.hash;
  for (std::uint32_t t : s.ring) x = splitmix(x ^ t);  // the window matters too
  return static_cast<std::uint32_t>(x % 50'000);
}

void ToyModel::token_kv(std::uint64_t h, std::size_t p, std::byte* out) const {
  fill(h ^ (0x1234567ull * (p + 1)), out, per_token_[p]);
}

std::vector<std::byte> ToyModel::image(const ToyState& s) const {
  std::vector<std::byte> img(layout_.checkpoint.image_bytes);
  std::memcpy(img.data(), &kMagic, 8);
  std::memcpy(img.data() + 8, &s, sizeof s);
  fill(s.hash ^ s.cursor, img.data() + 8 + sizeof s, img.size() - 8 - sizeof s);
  return img;
}

bool ToyModel::from_image(std::span<const std::byte> image, ToyState* out) {
  std::uint64_t magic = 0;
  if (image.size() < 8 + sizeof(ToyState)) return false;
  std::memcpy(&magic, image.data(), 8);
  if (magic != kMagic) return false;
  std::memcpy(out, image.data() + 8, sizeof(ToyState));
  return true;
}

ToyModel::Reference ToyModel::reference(std::span<const std::uint32_t> prompt, std::uint32_t outputs) {
  Reference r;
  ToyState s;
  r.hashes.reserve(prompt.size());
  for (std::uint32_t t : prompt) r.hashes.push_back(advance(s, t));
  r.prompt_state = s;
  for (std::uint32_t i = 0; i < outputs; ++i) {
    const std::uint32_t tok = next_token(s);
    r.outputs.push_back(tok);
    advance(s, tok);
  }
  return r;
}

}  // namespace kvstrand::engine
