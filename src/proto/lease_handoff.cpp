#include "proto/lease_handoff.hpp"

#include "proto/wire.hpp"

namespace kvstrand::proto {

namespace {
constexpr std::uint32_t kMagic = 0x484c564b;  // "KVLH"
constexpr std::uint8_t kVersion = 1;
}  // namespace

std::vector<std::byte> encode_lease_handoff(const LeaseHandoff& h) {
  wire::Writer w;
  w.u32(kMagic);
  w.u8(kVersion);
  w.u64(h.lease);
  w.u32(static_cast<std::uint32_t>(h.keys.size()));
  for (const ChunkKey& k : h.keys) wire::put_key(w, k);
  return w.take();
}

std::optional<LeaseHandoff> decode_lease_handoff(std::span<const std::byte> bytes, std::string* why) {
  wire::Reader r(bytes);
  if (r.u32() != kMagic || !r.ok()) {
    *why = "not a kvstrand lease handoff";
    return std::nullopt;
  }
  if (const std::uint8_t v = r.u8(); v != kVersion) {
    *why = "a lease handoff of version " + std::to_string(v) + " (this kvstrand reads " + std::to_string(kVersion) + ")";
    return std::nullopt;
  }
  LeaseHandoff h;
  h.lease = r.u64();
  const std::uint32_t n = r.count(wire::kKeyBytes);
  h.keys.resize(n);
  for (ChunkKey& k : h.keys) k = wire::get_key(r);
  if (!r.done()) {
    *why = "a truncated or overlong lease handoff";
    return std::nullopt;
  }
  if (h.lease == 0 || h.keys.empty()) {
    *why = "a lease handoff naming no lease or no chunk";
    return std::nullopt;
  }
  return h;
}

}  // namespace kvstrand::proto
