// The public sim hooks (include/kvstrand/sim.hpp) over the sim backend's own.
#include <kvstrand/sim.hpp>

#include <stdexcept>
#include <string>

#include "device/sim_hooks.hpp"
#include "device/stream.hpp"

namespace kvstrand::sim {

namespace {

// Stream 0 is the legacy default stream: it can be neither held nor delayed.
device::Stream borrowed(NativeStream s, const char* hook) {
  if (s == 0) throw std::runtime_error(std::string("kvstrand::sim::") + hook + ": stream 0 (the default stream)");
  return device::Stream::borrow(reinterpret_cast<void*>(s));
}

void must(const device::Status& s, const char* hook) {
  if (!s.ok()) throw std::runtime_error(std::string("kvstrand::sim::") + hook + ": " + s.describe());
}

}  // namespace

bool available() noexcept { return device::sim::available(); }

void set_stream_delay(NativeStream stream, std::chrono::microseconds delay) {
  device::Stream s = borrowed(stream, "set_stream_delay");
  must(device::sim::set_stream_delay(s, delay), "set_stream_delay");
}

void hold_stream(NativeStream stream) {
  device::Stream s = borrowed(stream, "hold_stream");
  must(device::sim::hold_stream(s), "hold_stream");
}

void release_stream(NativeStream stream) {
  device::Stream s = borrowed(stream, "release_stream");
  must(device::sim::release_stream(s), "release_stream");
}

void fail_copies(NativeStream stream, int count) {
  device::Stream s = borrowed(stream, "fail_copies");
  must(device::sim::fail_copies(s, device::sim::FailAt::execute, device::Errc::injected_fault, count), "fail_copies");
}

}  // namespace kvstrand::sim
