#include <kvstrand/errors.hpp>

namespace kvstrand {
namespace {

class TransferCategory final : public std::error_category {
 public:
  const char* name() const noexcept override { return "kvstrand.transfer"; }
  std::string message(int ev) const override {
    switch (static_cast<TransferErrc>(ev)) {
      case TransferErrc::duplicate_transfer: return "a transfer of this kind for this request is still live";
      case TransferErrc::not_registered: return "no layout registered: call register_layout() first";
      // Also a registration's or a lease hand-off's refusal: no transfer is
      // implied, the detail before this text says what was wrong.
      case TransferErrc::bad_spec: return "refused as asked (nothing was posted or registered): fix the call";
      case TransferErrc::closed: return "the connector is closed";
      case TransferErrc::deadline_exceeded: return "transfer deadline exceeded (fail-stop)";
      case TransferErrc::fence_timeout: return "fence timed out (fail-stop)";
      case TransferErrc::tier_full: return "the tier is full of objects in use";
      case TransferErrc::missing_chunk: return "the tier does not hold every chunk of the load";
      case TransferErrc::device_error: return "a device copy failed";
      case TransferErrc::tier_unavailable: return "the tier server is unreachable; recompute what a load would bring";
      case TransferErrc::blocks_in_use:
        return "a live transfer writes or reads these blocks: wait for its outcome (or fence it) first";
      case TransferErrc::too_many_live:
        return "too many transfers or lookups live: drain finished() before posting more";
    }
    return "unknown transfer error";
  }
};

}  // namespace

const std::error_category& transfer_category() noexcept {
  static const TransferCategory c;
  return c;
}
std::error_code make_error_code(TransferErrc e) noexcept { return {static_cast<int>(e), transfer_category()}; }

}  // namespace kvstrand
