#include "kv/parse_bytes.hpp"

#include <cctype>

namespace kvstrand::kv {

std::optional<std::uint64_t> parse_bytes(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::uint64_t shift = 0;
  const char unit = static_cast<char>(std::toupper(static_cast<unsigned char>(text.back())));
  if (unit == 'K' || unit == 'M' || unit == 'G' || unit == 'T') {
    shift = unit == 'K' ? 10 : unit == 'M' ? 20 : unit == 'G' ? 30 : 40;
    text.remove_suffix(1);
  }
  if (text.empty() || text.size() > 15) return std::nullopt;
  std::uint64_t v = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + static_cast<std::uint64_t>(c - '0');
  }
  if (shift > 0 && v > (~0ull >> shift)) return std::nullopt;
  return v << shift;
}

}  // namespace kvstrand::kv
