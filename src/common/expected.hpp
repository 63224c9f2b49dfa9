// The one shape of a result that can fail with words: a value, or why not
// (std::expected<T, std::string>, which C++20 lacks). Decoders, parsers and
// checks return it; the reason is for a log line, a refusal or a reply, said
// once by whoever gives up. What crosses to the engine as a typed error adds
// a code to these words (reactor::Failure, TransferRefused).
//
// Header-only: the wire protocol (src/proto) uses it without linking common.
#pragma once

#include <optional>
#include <string>
#include <utility>

namespace kvstrand::common {

// Why something failed: what Expected holds instead of a value.
struct Unexpected {
  std::string why;
};

inline Unexpected unexpected(std::string why) { return Unexpected{std::move(why)}; }

template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : value_(std::move(value)) {}  // NOLINT: a value converts, as std::expected's does
  Expected(Unexpected u) : why_(std::move(u.why)) {}

  bool has_value() const noexcept { return value_.has_value(); }
  explicit operator bool() const noexcept { return has_value(); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  // Why there is no value ("" when there is one).
  const std::string& why() const noexcept { return why_; }

 private:
  std::optional<T> value_;
  std::string why_;
};

// Success or why not, with no value.
template <>
class [[nodiscard]] Expected<void> {
 public:
  Expected() = default;
  Expected(Unexpected u) : failed_(true), why_(std::move(u.why)) {}

  bool has_value() const noexcept { return !failed_; }
  explicit operator bool() const noexcept { return has_value(); }
  const std::string& why() const noexcept { return why_; }

 private:
  bool failed_ = false;
  std::string why_;
};

}  // namespace kvstrand::common
