#include "index_plane/index_plane.hpp"

namespace kvstrand::index_plane {

boost::asio::awaitable<Failure> IndexPlane::attach(Registration reg) {
  registrations_.regs_.push_back(std::move(reg));
  const std::uint32_t id = registrations_.size() - 1;
  Failure f = co_await attach_registration(id);
  if (f) registrations_.regs_.pop_back();  // a plane keeps only what it attached
  co_return f;
}

}  // namespace kvstrand::index_plane
