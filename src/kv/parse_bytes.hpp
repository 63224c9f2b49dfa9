// Sizes as operators write them: "8G", "512M", "64K", "1024" (binary units).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace kvstrand::kv {

// None when `text` is not such a size (or overflows 64 bits).
std::optional<std::uint64_t> parse_bytes(std::string_view text);

}  // namespace kvstrand::kv
