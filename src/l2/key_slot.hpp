// The Redis Cluster hash slot of a key: CRC16 (XMODEM) of the key, or of its
// hash tag (the bytes between the first '{' and the next '}', when not
// empty), modulo 16384.
#pragma once

#include <cstdint>
#include <string_view>

namespace kvstrand::l2 {

inline constexpr std::uint16_t kSlots = 16384;

std::uint16_t crc16(std::string_view bytes) noexcept;
std::uint16_t key_slot(std::string_view key) noexcept;

}  // namespace kvstrand::l2
