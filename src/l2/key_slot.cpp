#include "l2/key_slot.hpp"

namespace kvstrand::l2 {

std::uint16_t crc16(std::string_view bytes) noexcept {
  // CRC-16/XMODEM (polynomial 0x1021, initial 0), bit by bit: keys are
  // short, and this is the definition the cluster specification gives.
  std::uint16_t crc = 0;
  for (unsigned char c : bytes) {
    crc ^= static_cast<std::uint16_t>(c) << 8;
    for (int i = 0; i < 8; ++i) crc = (crc & 0x8000) ? static_cast<std::uint16_t>((crc << 1) ^ 0x1021) : crc << 1;
  }
  return crc;
}

std::uint16_t key_slot(std::string_view key) noexcept {
  if (const auto open = key.find('{'); open != std::string_view::npos) {
    const auto close = key.find('}', open + 1);
    if (close != std::string_view::npos && close != open + 1) key = key.substr(open + 1, close - open - 1);
  }
  return crc16(key) % kSlots;
}

}  // namespace kvstrand::l2
