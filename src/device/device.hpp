// Which device runtime this build talks to, and which device it uses.
//
// The backend is fixed at configure time (-DKVSTRAND_GPU=sim|hip|cuda). These
// calls are safe from any thread.
#pragma once

#include <string>

#include "device/status.hpp"

namespace kvstrand::device {

// "sim", "hip" or "cuda".
const char* backend_name() noexcept;

// True for backends that drive a real GPU.
bool backend_is_gpu() noexcept;

// Number of devices this backend can use (0 with no GPU, 1 for sim).
Result<int> device_count();

// The device's marketing name ("NVIDIA H200", "kvstrand sim device").
Result<std::string> device_name(int ordinal);

// Makes `ordinal` the current device of the calling thread.
Status select_device(int ordinal);

}  // namespace kvstrand::device
