#include "hip/event.hpp"

#include "hip/stream.hpp"

namespace kvstrand::hip {

Result<Event> Event::create() {
  void* h = nullptr;
  if (Status s = backend::event_create(&h); !s.ok()) return s;
  return Event(h);
}

Status Event::record(Stream& s) { return backend::event_record(h_.get(), s.native()); }
Status Event::query() const { return backend::event_query(h_.get()); }
Status Event::synchronize() const { return backend::event_synchronize(h_.get()); }

}  // namespace kvstrand::hip
