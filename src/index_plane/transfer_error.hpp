// The engine-boundary errors (include/kvstrand/errors.hpp) under the names
// the reactor's code uses.
#pragma once

#include <kvstrand/errors.hpp>

namespace kvstrand::index_plane {
using kvstrand::FailStop;
using kvstrand::TransferErrc;
using kvstrand::TransferRefused;
using kvstrand::transfer_category;
}  // namespace kvstrand::index_plane
