// The registrations attached to a Connector's index plane, by id (the order
// attached: 0, 1, ...), as specs and lookups name them: the one table of
// them on the strand. The levels above read it (HostTier's copies, the
// TransferTable's chunk sizes); each plane keeps only its own state by the
// same id (LocalIndex its objects' size class, ServerSession the server's
// id). Entries never move (a deque): a reference stays good while the
// plane lives.
#pragma once

#include <cstdint>
#include <deque>

#include <kvstrand/registration.hpp>

namespace kvstrand::index_plane {

using kvstrand::Registration;

class Registrations {
 public:
  std::uint32_t size() const noexcept { return static_cast<std::uint32_t>(regs_.size()); }
  bool empty() const noexcept { return regs_.empty(); }
  // Registration `id`; nullptr where none is attached by that id (a spec
  // the Connector would have refused).
  const Registration* find(std::uint32_t id) const noexcept { return id < regs_.size() ? &regs_[id] : nullptr; }
  // Registration `id`; std::out_of_range where none is.
  const Registration& at(std::uint32_t id) const { return regs_.at(id); }

 private:
  friend class IndexPlane;  // its attach() alone adds one, and takes back one it could not attach
  std::deque<Registration> regs_;
};

}  // namespace kvstrand::index_plane
