// Fault and timing injection for the sim backend.
//
// Tests use these to make bad timing happen deterministically: a stream that
// is slow, a stream that stops, a copy that fails when submitted or when it
// runs. On the GPU backends every hook returns Errc::not_supported and
// available() is false, so a test that needs one skips with a message there.
#pragma once

#include <chrono>
#include <cstdint>

#include "device/load_path.hpp"
#include "device/status.hpp"

namespace kvstrand::device {
class Stream;
}

namespace kvstrand::device::sim {

bool available() noexcept;

// Every operation on `s` waits `d` before it runs; zero turns it off.
Status set_stream_delay(Stream& s, std::chrono::microseconds d);

// `s` stops before its next operation until release_stream(). Destroying the
// stream releases it.
Status hold_stream(Stream& s);
Status release_stream(Stream& s);

enum class FailAt {
  submit,   // the copy call itself returns `code`; nothing is queued
  execute,  // the copy is queued but moves nothing; the next event recorded
            // on the stream completes with `code`
};

// The next `count` copies (single or batched) on `s` fail with `code`.
Status fail_copies(Stream& s, FailAt at, Errc code = Errc::injected_fault, int count = 1);

// A host where one load path is slow (device/load_path.hpp): from now on every
// batch that goes by `path` (the gather kernel, or one batched DMA call)
// waits per_segment for each of its segments and per_mib for each MiB
// before it runs, on its stream. Both zero: no cost. Process-wide. Once
// any path has a cost, the load paths differ (a Connector measures them).
Status set_load_path_cost(LoadPath path, std::chrono::nanoseconds per_segment, std::chrono::nanoseconds per_mib);
// Batches that have gone by `path` in this process (0 on a GPU backend).
std::uint64_t batches_by(LoadPath path) noexcept;

}  // namespace kvstrand::device::sim
