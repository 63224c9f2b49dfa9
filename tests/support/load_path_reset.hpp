// Ends a test with the process's load path (device/load_path.hpp) as a fresh
// process has it, and the sim's load-path costs off: a GPU run keeps one
// process for a whole test binary, and the choice is process-wide.
#pragma once

#include <chrono>

#include "device/load_path.hpp"
#include "device/sim_hooks.hpp"

namespace kvstrand::test {

struct LoadPathReset {
  ~LoadPathReset() {
    using std::chrono::nanoseconds;
    device::forget_load_paths();
    if (device::sim::available()) {
      (void)device::sim::set_load_path_cost(device::LoadPath::kernel, nanoseconds(0), nanoseconds(0));
      (void)device::sim::set_load_path_cost(device::LoadPath::dma_batch, nanoseconds(0), nanoseconds(0));
    }
  }
};

}  // namespace kvstrand::test
