// The little of MessagePack the server's KV events need: a writer of the
// types vLLM's event batches use, and a reader that checks one value's
// structure and splits a map into its keys and raw values (a chunk's
// event description, which a client sends, is copied into events
// unchanged, whatever types its values have).
//
// The reader is bounds-checked and bounded in depth: a malformed
// description is refused, never read past.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvstrand::server::msgpack {

class Writer {
 public:
  void nil() { byte(0xc0); }
  void boolean(bool b) { byte(b ? 0xc3 : 0xc2); }
  void uint(std::uint64_t v);
  void sint(std::int64_t v);
  void float64(double v);
  void str(std::string_view s);
  void array(std::uint32_t n);
  void map(std::uint32_t n);
  // A value encoded already (checked by the caller).
  void raw(std::string_view encoded) { out_.append(encoded); }
  std::string& buffer() noexcept { return out_; }
  std::string take() { return std::move(out_); }

 private:
  void byte(std::uint8_t b) { out_.push_back(static_cast<char>(b)); }
  void be(std::uint64_t v, int n);
  void header(std::uint32_t n, std::uint8_t fix, std::uint8_t fix_max, std::uint8_t b16, std::uint8_t b32);
  std::string out_;
};

// The end of the one value that starts at `at` in `in`; nothing when it is
// cut short, malformed, or nested deeper than 32.
std::optional<std::size_t> skip(std::string_view in, std::size_t at = 0);

// `in`, one map with string keys and nothing after it, as (key, raw value)
// pairs in order; nothing otherwise.
std::optional<std::vector<std::pair<std::string_view, std::string_view>>> read_map(std::string_view in);

// Whether the raw value is an array, and its length; whether it is nil.
std::optional<std::uint32_t> array_length(std::string_view value);
bool is_nil(std::string_view value);
// Whether the raw value is an integer (any width, either sign); a byte
// string (bin 8/16/32); a text string.
bool is_int(std::string_view value);
bool is_bytes(std::string_view value);
bool is_str(std::string_view value);
// The items of a raw array value (each raw).
std::optional<std::vector<std::string_view>> array_items(std::string_view value);

}  // namespace kvstrand::server::msgpack
