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
namespace kvstrand::sim {

bool available() noexcept;

// Every operation on `stream` waits `delay` before it runs; zero turns it off.
void set_stream_delay(NativeStream stream, std::chrono::microseconds delay);

// `stream` stops before its next operation until release_stream().
// Destroying the stream releases it.
void hold_stream(NativeStream stream);
void release_stream(NativeStream stream);

}  // namespace kvstrand::sim
#pragma GCC visibility pop
