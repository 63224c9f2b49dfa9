// Sizes as operators write them: "8G", "512M", "64K", "1024" (binary units),
// read from flags and written back in messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace kvstrand::common {

// None when `text` is not such a size (or overflows 64 bits).
std::optional<std::uint64_t> parse_bytes(std::string_view text);

// In the largest binary unit that keeps three significant digits, e.g.
// "8 GiB", "1.50 GiB", "2 MiB", "100 B": what a message says of a size.
std::string format_bytes(std::uint64_t bytes);

}  // namespace kvstrand::common
