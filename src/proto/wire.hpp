// Little-endian, bounds-checked encoding of the primitives the server
// protocol is made of (docs/protocol.md). A Reader never reads past its end:
// the first short read marks it failed and every later read returns zeros,
// so a decoder checks ok() once at the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <kvstrand/chunk_keys.hpp>

namespace kvstrand::proto::wire {

using kv::ChunkKey;
using kv::Digest;

class Writer {
 public:
  void u8(std::uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void u16(std::uint16_t v) { le(v, 2); }
  void u32(std::uint32_t v) { le(v, 4); }
  void u64(std::uint64_t v) { le(v, 8); }
  void bytes(std::span<const std::byte> b) { out_.insert(out_.end(), b.begin(), b.end()); }
  void str(const std::string& s) {
    u32(static_cast<std::uint32_t>(s.size()));
    bytes(std::as_bytes(std::span(s.data(), s.size())));
  }
  std::vector<std::byte>& buffer() noexcept { return out_; }
  std::vector<std::byte> take() { return std::move(out_); }

 private:
  void le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out_.push_back(static_cast<std::byte>((v >> (8 * i)) & 0xff));
  }
  std::vector<std::byte> out_;
};

class Reader {
 public:
  explicit Reader(std::span<const std::byte> in) : in_(in) {}

  std::uint8_t u8() { return static_cast<std::uint8_t>(le(1)); }
  std::uint16_t u16() { return static_cast<std::uint16_t>(le(2)); }
  std::uint32_t u32() { return static_cast<std::uint32_t>(le(4)); }
  std::uint64_t u64() { return le(8); }
  void bytes(std::span<std::byte> out) {
    if (!take(out.size())) {
      std::memset(out.data(), 0, out.size());
      return;
    }
    std::memcpy(out.data(), in_.data() + at_ - out.size(), out.size());
  }
  // A string of at most `max` bytes.
  std::string str(std::size_t max = 4096) {
    const std::uint32_t n = u32();
    if (n > max || !take(n)) {
      ok_ = false;
      return {};
    }
    return std::string(reinterpret_cast<const char*>(in_.data() + at_ - n), n);
  }
  // A count of items each at least `min_item_bytes` long: refused when the
  // rest of the input cannot hold them, before anything is allocated.
  std::uint32_t count(std::size_t min_item_bytes) {
    const std::uint32_t n = u32();
    if (min_item_bytes > 0 && n > remaining() / min_item_bytes) ok_ = false;
    return ok_ ? n : 0;
  }
  void fail() noexcept { ok_ = false; }
  bool ok() const noexcept { return ok_; }
  std::size_t remaining() const noexcept { return ok_ ? in_.size() - at_ : 0; }
  bool done() const noexcept { return ok_ && at_ == in_.size(); }

 private:
  bool take(std::size_t n) {
    if (!ok_ || n > in_.size() - at_) {
      ok_ = false;
      return false;
    }
    at_ += n;
    return true;
  }
  std::uint64_t le(int n) {
    if (!take(static_cast<std::size_t>(n))) return 0;
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<std::uint64_t>(in_[at_ - n + i]) << (8 * i);
    return v;
  }
  std::span<const std::byte> in_;
  std::size_t at_ = 0;
  bool ok_ = true;
};

// A chunk key: namespace, rank, hash (68 bytes).
inline constexpr std::size_t kKeyBytes = 32 + 4 + 32;
inline void put_key(Writer& w, const ChunkKey& k) {
  w.bytes(k.ns);
  w.u32(k.kv_rank);
  w.bytes(k.hash);
}
inline ChunkKey get_key(Reader& r) {
  ChunkKey k;
  r.bytes(k.ns);
  k.kv_rank = r.u32();
  r.bytes(k.hash);
  return k;
}

}  // namespace kvstrand::proto::wire
