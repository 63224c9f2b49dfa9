// Ends a test with the process's load path (hip/load_path.hpp) as a fresh
// process has it, and the sim's load-path costs off: a GPU run keeps one
// process for a whole test binary, and the choice is process-wide.
#pragma once

#include <chrono>

#include "hip/load_path.hpp"
#include "hip/sim_hooks.hpp"

namespace kvstrand::test {

struct LoadPathReset {
  ~LoadPathReset() {
    using std::chrono::nanoseconds;
    hip::forget_load_paths();
    if (hip::sim::available()) {
      (void)hip::sim::set_load_path_cost(hip::LoadPath::kernel, nanoseconds(0), nanoseconds(0));
      (void)hip::sim::set_load_path_cost(hip::LoadPath::dma_batch, nanoseconds(0), nanoseconds(0));
    }
  }
};

}  // namespace kvstrand::test
