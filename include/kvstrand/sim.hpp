// The sim backend's fault hooks, for tests of an engine built on kvstrand:
// make a stream slow, or stop it until released, so that bad timing happens
// deterministically. The sim backend is the library built with
// KVSTRAND_GPU=sim (kvstrand::backend() says "sim"). On a GPU backend
// available() is false and every other call throws std::runtime_error.
//
// Errors are std::runtime_error naming the hook and the stream.
#pragma once

#include <chrono>

#include <kvstrand/device_memory.hpp>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand {
class Connector;
}

namespace kvstrand::sim {

bool available() noexcept;

// Every operation on `stream` waits `delay` before it runs; zero turns it off.
void set_stream_delay(NativeStream stream, std::chrono::microseconds delay);

// `stream` stops before its next operation until release_stream().
// Destroying the stream releases it.
void hold_stream(NativeStream stream);
void release_stream(NativeStream stream);

// The next `count` copies queued on `stream` move nothing, and the next
// event recorded on it after them completes with an injected fault (the
// failed transfer's reason says "injected").
void fail_copies(NativeStream stream, int count = 1);

// The stream `connector`'s tier queues its loads' copies on (the embedded
// tier's and the node tier's alike): hold it and a load cannot end, fail its
// copies and a load fails where it runs. Throws once the connector is
// closed, or before its first register_layout() (the tier has no stream yet).
NativeStream load_stream(Connector& connector);

}  // namespace kvstrand::sim
#pragma GCC visibility pop
