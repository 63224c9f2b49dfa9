// The one way to never free something: what a device copy never seen to
// end may still read or write. Freeing it could hand that memory to someone
// else while the copy writes it; waiting for the copy could be forever. So
// it is kept, reachable from a static (not a leak to a checker), until the
// process exits. Any thread.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

namespace kvstrand::device {

void keep_shared_for_process_life(std::shared_ptr<void> thing);

// How many things were kept so far: none, unless a copy never ended.
std::size_t kept_for_process_life();

template <class T>
void keep_for_process_life(T&& thing) {
  keep_shared_for_process_life(std::make_shared<std::decay_t<T>>(std::forward<T>(thing)));
}

}  // namespace kvstrand::device
