#include "common/parse_bytes.hpp"

#include <cctype>
#include <cstdio>

namespace kvstrand::common {

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

std::string format_bytes(std::uint64_t bytes) {
  static constexpr const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int u = 0;
  while (u < 6 && bytes >= (1ull << (10 * (u + 1)))) ++u;
  char buf[32];
  if (u == 0 || bytes % (1ull << (10 * u)) == 0) {
    std::snprintf(buf, sizeof buf, "%llu %s", static_cast<unsigned long long>(bytes >> (10 * u)), units[u]);
  } else {
    const double v = static_cast<double>(bytes) / static_cast<double>(1ull << (10 * u));
    std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, units[u]);
  }
  return buf;
}

}  // namespace kvstrand::common
