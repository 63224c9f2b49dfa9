#include "proto/lease_handoff.hpp"

#include "proto/wire.hpp"

namespace kvstrand::proto {

namespace {
constexpr std::uint32_t kHandoffMagic = 0x484c564b;  // "KVLH"
constexpr std::uint8_t kVersion = 1;
}  // namespace

std::vector<std::byte> encode_lease_handoff(const LeaseHandoff& h) {
  wire::Writer w;
  w.u32(kHandoffMagic);
  w.u8(kVersion);
  w.u64(h.lease);
  w.u32(static_cast<std::uint32_t>(h.keys.size()));
  for (const ChunkKey& k : h.keys) wire::put_key(w, k);
  return w.take();
}

common::Expected<LeaseHandoff> decode_lease_handoff(std::span<const std::byte> bytes) {
  wire::Reader r(bytes);
  if (r.u32() != kHandoffMagic || !r.ok()) {
    return common::unexpected("not a kvstrand lease handoff");
  }
  if (const std::uint8_t v = r.u8(); v != kVersion) {
    return common::unexpected("a lease handoff of version " + std::to_string(v) + " (this kvstrand reads " + std::to_string(kVersion) + ")");
  }
  LeaseHandoff h;
  h.lease = r.u64();
  const std::uint32_t n = r.count(wire::kKeyBytes);
  h.keys.resize(n);
  for (ChunkKey& k : h.keys) k = wire::get_key(r);
  if (!r.done()) {
    return common::unexpected("a truncated or overlong lease handoff");
  }
  if (h.lease == 0 || h.keys.empty()) {
    return common::unexpected("a lease handoff naming no lease or no chunk");
  }
  return h;
}

}  // namespace kvstrand::proto
