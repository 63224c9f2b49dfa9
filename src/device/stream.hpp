// A device stream: an ordered queue of copies and event records.
//
// Owns one backend stream. Destroying it lets already queued work finish.
// Safe to use from any one thread at a time.
#pragma once

#include "device/backend.hpp"
#include "device/unique_handle.hpp"

namespace kvstrand::device {

class Event;

class Stream {
 public:
  static Result<Stream> create();
  // An engine's own stream (hipStream_t / cudaStream_t), not owned: never
  // destroyed here. 0 is the device's default stream.
  static Stream borrow(void* native) noexcept;

  Stream(Stream&&) noexcept = default;
  Stream& operator=(Stream&&) noexcept = default;

  // Blocks the calling thread until all queued work is done. Never call it on
  // the reactor strand: await an Event through the Poller instead.
  Status synchronize();
  // ok when idle, Errc::not_ready while work is queued.
  Status query();
  // Runs fn(arg) on a runtime thread once all earlier work is done. fn must
  // not call into the device runtime and must return quickly.
  Status host_func(void (*fn)(void*), void* arg);
  // Work queued after this waits for the event's latest record, on the
  // device: the calling thread does not wait.
  Status wait(const Event& e);

  void* native() const noexcept { return h_ ? h_.get() : borrowed_; }

 private:
  explicit Stream(void* h) : h_(h) {}
  detail::UniqueHandle<&backend::stream_destroy> h_;
  void* borrowed_ = nullptr;
};

}  // namespace kvstrand::device
