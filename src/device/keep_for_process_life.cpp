#include "device/keep_for_process_life.hpp"

#include <mutex>
#include <vector>

namespace kvstrand::device {

void keep_shared_for_process_life(std::shared_ptr<void> thing) {
  if (!thing) return;
  static std::mutex* guard = new std::mutex;
  static auto* kept = new std::vector<std::shared_ptr<void>>;
  std::lock_guard lock(*guard);
  kept->push_back(std::move(thing));
}

}  // namespace kvstrand::device
