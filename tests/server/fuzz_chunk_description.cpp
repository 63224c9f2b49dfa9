// libFuzzer target for what kvstrand-server reads of a client's chunk
// descriptions (protocol 2.4's reserve, and an L2 value's description):
// arbitrary bytes through the msgpack reader and description_problem. One
// it accepts is encoded into a batch of each event format, which must read
// back as one msgpack value whose events array holds the two events; and
// the part of it the server keeps once announced (removal_part) must say
// the same BlockRemoved as the whole. It
// must never crash, read out of bounds or allocate without bound (ASan +
// UBSan watch). Built and run by `make fuzz` with clang-14.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "server/events/kv_event_codec.hpp"
#include "server/events/msgpack.hpp"

using namespace kvstrand::server;

namespace {

// The batch's events array: its second element (array and events-map
// shapes), or the value under "events" (map shape).
std::string_view events_of(std::string_view batch, EventFormat f) {
  if (f == EventFormat::map) {
    auto m = msgpack::read_map(batch);
    if (!m) return {};
    for (const auto& [k, v] : *m)
      if (k == "events") return v;
    return {};
  }
  auto items = msgpack::array_items(batch);
  return items && items->size() == 2 ? (*items)[1] : std::string_view{};
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  (void)msgpack::skip(in);
  (void)msgpack::read_map(in);
  (void)msgpack::array_items(in);
  if (description_problem(in)) return 0;
  const auto part = removal_part(in);
  if (!part) std::abort();
  for (EventFormat f : {EventFormat::array, EventFormat::events_map, EventFormat::map}) {
    msgpack::Writer whole, kept;
    encode_removed(whole, in, "CPU", f);
    encode_removed(kept, *part, "CPU", f);
    if (whole.buffer() != kept.buffer()) std::abort();
  }
  for (EventFormat f : {EventFormat::array, EventFormat::events_map, EventFormat::map}) {
    msgpack::Writer w;
    encode_stored(w, in, "CPU", f);
    encode_removed(w, in, "DISK", f);
    const std::string batch = encode_batch(1.5, w.buffer(), 2, f);
    // A description nested near the reader's depth bound may not read
    // back once wrapped in a batch; one that does must be whole.
    const auto end = msgpack::skip(batch);
    if (!end) continue;
    if (*end != batch.size()) std::abort();
    if (std::string_view events = events_of(batch, f); !events.empty() && msgpack::array_length(events) != 2u)
      std::abort();
  }
  return 0;
}
