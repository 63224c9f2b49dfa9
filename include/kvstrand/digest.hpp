// A SHA-256 digest: namespaces and chunk hashes.
#pragma once

#include <array>
#include <cstddef>
#include <string>

namespace kvstrand::kv {

using Digest = std::array<std::byte, 32>;

std::string to_hex(const Digest& d);

}  // namespace kvstrand::kv
