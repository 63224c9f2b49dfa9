// A SHA-256 digest: namespaces and chunk hashes.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand::kv {

using Digest = std::array<std::byte, 32>;

std::string to_hex(const Digest& d);

}  // namespace kvstrand::kv
#pragma GCC visibility pop
