// The node tier: HostTier's data path over a RemoteIndex (kvstrand-server
// keeps the index and the arena; this process maps the arena and copies).
// A copy that was submitted and not seen complete is a deadline fail-stop
// (the Connector's), never "recompute".
#pragma once

#include <memory>

#include "reactor/host_tier.hpp"
#include "reactor/remote_index.hpp"

namespace kvstrand::reactor {

class NodeTier final : public HostTier {
 public:
  NodeTier(Reactor& reactor, NodeTierOptions options)
      : HostTier(reactor, std::make_unique<RemoteIndex>(reactor, std::move(options))) {}

  std::uint64_t reconnects() const noexcept { return remote().reconnects(); }
  // Requests turned away while no server answered; registrations a server
  // refused on a later connection (read on the strand: Connector::arena_mappings()).
  std::uint64_t turned_away() const noexcept { return remote().turned_away(); }
  std::uint64_t connect_attempts() const noexcept { return remote().connect_attempts(); }
  std::uint64_t refusals() const noexcept { return remote().refusals(); }
  std::uint64_t arena_mapped() const noexcept { return remote().arena_mapped(); }
  std::uint64_t arena_kept() const noexcept { return remote().arena_kept(); }
  // The current arena's size and how much of it is pinned (on the strand).
  std::uint64_t arena_bytes() const noexcept { return remote().arena_bytes(); }
  std::uint64_t pinned_bytes() const noexcept { return remote().pinned_bytes(); }

 private:
  const RemoteIndex& remote() const { return static_cast<const RemoteIndex&>(index()); }
};

}  // namespace kvstrand::reactor
