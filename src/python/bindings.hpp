// The kvstrand Python module (kvstrand._kvstrand): one bind_* per concept,
// each in its own file, all called from module.cpp.
//
// Everything here goes through libkvstrand.so's public headers, the same
// API a C++ engine links (the sim hooks' declarations are the exception:
// their code is in the library too).
#pragma once

#include <pybind11/pybind11.h>

#include <kvstrand/digest.hpp>

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace kvstrand::python {

namespace py = pybind11;

void bind_errors(py::module_& m);     // exception types, TransferErrc
void bind_layout(py::module_& m);     // Layout and its parts, validation, namespace, chunk keys
void bind_planner(py::module_& m);    // token ranges, plan_hit/plan_groups, SaveTracker, LoadOutcome
void bind_device(py::module_& m);     // DeviceMemory, DeviceStream, and the `sim` submodule
void bind_connector(py::module_& m);  // options, registrations, specs, outcomes, the Connector
void bind_page_store(py::module_& m); // the PageStore: pages in host memory (kvstrand.sglang)

// Raises ConfigError (option, message) for a configuration kvstrand refuses.
[[noreturn]] void raise_config_error(const std::string& option, const std::string& message);
// The option an "invalid option 'NAME': ..." message names; empty if none.
std::string option_named_in(const std::string& message);

// conversions.cpp. Digests cross as 32-byte `bytes`.
py::bytes to_bytes(const kv::Digest& d);
kv::Digest to_digest(const py::handle& b, const char* what);

// Durations cross as seconds (int or float) or datetime.timedelta.
std::chrono::microseconds duration_of(const py::handle& seconds, const char* what);
py::object seconds_of(std::chrono::microseconds d);

// A prompt's tokens: a contiguous 4-byte unsigned buffer (numpy uint32,
// array('I')) is read in place; any other sequence of ints is converted.
// Destroy it with the GIL held.
class Tokens {
 public:
  explicit Tokens(const py::handle& obj);
  std::span<const std::uint32_t> span() const noexcept { return span_; }

 private:
  std::vector<std::uint32_t> copy_;
  // The buffer stays exported while span_ points into it, so no other
  // thread can resize it while the GIL is released (array.array refuses).
  std::optional<py::buffer_info> view_;
  std::span<const std::uint32_t> span_;
};

}  // namespace kvstrand::python
