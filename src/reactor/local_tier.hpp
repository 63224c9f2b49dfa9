// The embedded default tier: HostTier's data path over a LocalIndex (a
// pinned arena and its index, in the engine process).
#pragma once

#include <memory>

#include "reactor/host_tier.hpp"
#include "reactor/local_index.hpp"

namespace kvstrand::reactor {

class LocalTier final : public HostTier {
 public:
  LocalTier(Reactor& reactor, std::uint64_t capacity_bytes)
      : HostTier(reactor, std::make_unique<LocalIndex>(capacity_bytes)) {}


  // The streams the tier copies on (tests hold them with the sim hooks);
  // created by the first attach.
  hip::Stream& save_stream() { return *HostTier::save_stream(); }
  hip::Stream& load_stream() { return *HostTier::load_stream(); }
};

}  // namespace kvstrand::reactor
