// An ordinary device event (timing disabled, not interprocess).
//
// An event marks a point in a stream: it completes when the stream reaches it.
// An event never recorded counts as complete, as in HIP. Events are cheap to
// record and query but not to create: the hot path takes them from an
// EventPool rather than calling create().
#pragma once

#include "device/backend.hpp"
#include "device/unique_handle.hpp"

namespace kvstrand::device {

class Stream;

class Event {
 public:
  static Result<Event> create();
  // An engine's own event (hipEvent_t / cudaEvent_t), not owned: never
  // destroyed here; the engine keeps it alive while kvstrand may query it.
  static Event borrow(void* native) noexcept;

  Event(Event&&) noexcept = default;
  Event& operator=(Event&&) noexcept = default;

  Status record(Stream& s);
  // ok once complete; Errc::not_ready while pending; otherwise the failure of
  // the work it waited for (e.g. Errc::launch_failure, Errc::injected_fault).
  Status query() const;
  // Blocks the calling thread; never on the reactor strand.
  Status synchronize() const;

  void* native() const noexcept { return h_ ? h_.get() : borrowed_; }

 private:
  explicit Event(void* h) : h_(h) {}
  detail::UniqueHandle<&backend::event_destroy> h_;
  void* borrowed_ = nullptr;
};

}  // namespace kvstrand::device
