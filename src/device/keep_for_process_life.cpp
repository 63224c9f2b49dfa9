#include "device/keep_for_process_life.hpp"

#include <mutex>
#include <vector>

namespace kvstrand::device {

namespace {
// Never destroyed: a thing may be kept from any thread until exit.
std::mutex& guard() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<std::shared_ptr<void>>& kept() {
  static auto* v = new std::vector<std::shared_ptr<void>>;
  return *v;
}
}  // namespace

void keep_shared_for_process_life(std::shared_ptr<void> thing) {
  if (!thing) return;
  std::lock_guard lock(guard());
  kept().push_back(std::move(thing));
}

std::size_t kept_for_process_life() {
  std::lock_guard lock(guard());
  return kept().size();
}

}  // namespace kvstrand::device
