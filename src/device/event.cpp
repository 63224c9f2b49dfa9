#include "device/event.hpp"

#include "device/stream.hpp"

namespace kvstrand::device {

Result<Event> Event::create() {
  void* h = nullptr;
  if (Status s = backend::event_create(&h); !s.ok()) return s;
  return Event(h);
}

Event Event::borrow(void* native) noexcept {
  Event e(nullptr);
  e.borrowed_ = native;
  return e;
}

Status Event::record(Stream& s) { return backend::event_record(native(), s.native()); }
Status Event::query() const { return backend::event_query(native()); }
Status Event::synchronize() const { return backend::event_synchronize(native()); }

}  // namespace kvstrand::device
