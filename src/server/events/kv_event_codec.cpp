#include "server/events/kv_event_codec.hpp"

#include <array>
#include <vector>

namespace kvstrand::server {

namespace {

// vLLM's fields of BlockStored in declaration order, and whether msgspec
// leaves each out when it has its default (None): the first seven have no
// default and are always there.
struct Field {
  std::string_view name;
  bool optional;
};
constexpr std::array<Field, 11> kStored{{{"block_hashes", false},
                                         {"parent_block_hash", false},
                                         {"token_ids", false},
                                         {"block_size", false},
                                         {"lora_id", false},
                                         {"medium", false},
                                         {"lora_name", false},
                                         {"extra_keys", true},
                                         {"group_idx", true},
                                         {"kv_cache_spec_kind", true},
                                         {"kv_cache_spec_sliding_window", true}}};
constexpr std::array<Field, 3> kRemoved{{{"block_hashes", false}, {"medium", false}, {"group_idx", true}}};

constexpr std::string_view kNil = "\xc0";

std::string_view lookup(const std::vector<std::pair<std::string_view, std::string_view>>& m, std::string_view key) {
  for (const auto& [k, v] : m)
    if (k == key) return v;
  return {};
}

// The event: tag, then the fields, from the description (medium given).
template <std::size_t N>
void encode(msgpack::Writer& w, std::string_view tag, const std::array<Field, N>& fields,
            std::string_view description, std::string_view medium, EventFormat f) {
  const auto m = msgpack::read_map(description).value_or(decltype(msgpack::read_map(description))::value_type{});
  std::array<std::string_view, N> values{};
  std::string medium_value;
  {
    msgpack::Writer mw;
    mw.str(medium);
    medium_value = mw.take();
  }
  for (std::size_t i = 0; i < N; ++i) {
    const std::string_view v = fields[i].name == "medium" ? std::string_view(medium_value) : lookup(m, fields[i].name);
    // A field not described: None (token_ids: none known, an empty list).
    values[i] = !v.empty() ? v : fields[i].name == "token_ids" ? std::string_view("\x90", 1) : kNil;
  }
  const auto omitted = [&](std::size_t i) { return fields[i].optional && values[i] == kNil; };
  if (f == EventFormat::array) {
    // Trailing defaults are left out; one before a given field stays (None).
    std::size_t n = N;
    while (n > 0 && omitted(n - 1)) --n;
    w.array(static_cast<std::uint32_t>(n + 1));
    w.str(tag);
    for (std::size_t i = 0; i < n; ++i) w.raw(values[i]);
    return;
  }
  std::uint32_t present = 1;
  for (std::size_t i = 0; i < N; ++i) present += omitted(i) ? 0 : 1;
  w.map(present);
  w.str("type");
  w.str(tag);
  for (std::size_t i = 0; i < N; ++i) {
    if (omitted(i)) continue;
    w.str(fields[i].name);
    w.raw(values[i]);
  }
}

}  // namespace

std::optional<EventFormat> event_format(std::string_view name) {
  if (name == "array") return EventFormat::array;
  if (name == "events-map") return EventFormat::events_map;
  if (name == "map") return EventFormat::map;
  return std::nullopt;
}

const char* to_string(EventFormat f) noexcept {
  switch (f) {
    case EventFormat::array: return "array";
    case EventFormat::events_map: return "events-map";
    case EventFormat::map: return "map";
  }
  return "?";
}

std::optional<std::string> description_problem(std::string_view description) {
  // Checked against vLLM's BlockStored as msgspec decodes it: one wrong type
  // and a typed subscriber refuses the whole batch, every other engine's
  // events in it included.
  if (description.size() > kMaxDescriptionBytes)
    return "larger than " + std::to_string(kMaxDescriptionBytes) + " bytes";
  const auto m = msgpack::read_map(description);
  if (!m) return "not one msgpack map with string keys";
  const auto hash = [](std::string_view v) { return msgpack::is_bytes(v) || msgpack::is_int(v); };
  const auto nil_or = [](std::string_view v, auto&& ok) { return v.empty() || msgpack::is_nil(v) || ok(v); };
  const auto hashes = msgpack::array_items(lookup(*m, "block_hashes"));
  if (!hashes || hashes->empty()) return "no block_hashes array of at least one hash";
  for (std::string_view h : *hashes)
    if (!hash(h)) return "block_hashes holds a hash that is neither bytes nor an integer";
  if (!nil_or(lookup(*m, "parent_block_hash"), hash)) return "parent_block_hash is neither bytes, an integer nor nil";
  if (const std::string_view bs = lookup(*m, "block_size"); bs.empty()) {
    return "no block_size";
  } else if (const auto b = static_cast<std::uint8_t>(bs[0]); !(b >= 0x01 && b <= 0x7f) && !(b >= 0xcc && b <= 0xcf)) {
    return "block_size is not a positive integer";  // a negative or zero one is refused; so is any other type
  }
  if (const std::string_view tokens = lookup(*m, "token_ids"); !tokens.empty()) {
    const auto items = msgpack::array_items(tokens);
    if (!items) return "token_ids is not an array";
    for (std::string_view t : *items)
      if (!msgpack::is_int(t)) return "token_ids holds a token id that is not an integer";
  }
  if (!nil_or(lookup(*m, "lora_id"), msgpack::is_int)) return "lora_id is neither an integer nor nil";
  if (!nil_or(lookup(*m, "lora_name"), msgpack::is_str)) return "lora_name is neither a string nor nil";
  if (!nil_or(lookup(*m, "group_idx"), msgpack::is_int)) return "group_idx is neither an integer nor nil";
  if (!nil_or(lookup(*m, "extra_keys"), [](std::string_view v) { return msgpack::array_length(v).has_value(); }))
    return "extra_keys is neither an array nor nil";
  if (!nil_or(lookup(*m, "kv_cache_spec_kind"), msgpack::is_str)) return "kv_cache_spec_kind is neither a string nor nil";
  if (!nil_or(lookup(*m, "kv_cache_spec_sliding_window"), msgpack::is_int))
    return "kv_cache_spec_sliding_window is neither an integer nor nil";
  return std::nullopt;
}

void encode_stored(msgpack::Writer& w, std::string_view description, std::string_view medium, EventFormat f) {
  encode(w, "BlockStored", kStored, description, medium, f);
}

void encode_removed(msgpack::Writer& w, std::string_view description, std::string_view medium, EventFormat f) {
  encode(w, "BlockRemoved", kRemoved, description, medium, f);
}

std::optional<std::string> removal_part(std::string_view description) {
  const auto m = msgpack::read_map(description);
  if (!m) return std::nullopt;
  std::uint32_t n = 0;
  for (const Field& f : kRemoved) n += f.name != "medium" && !lookup(*m, f.name).empty() ? 1 : 0;
  msgpack::Writer w;
  w.map(n);
  for (const Field& f : kRemoved) {
    if (f.name == "medium") continue;
    if (const std::string_view v = lookup(*m, f.name); !v.empty()) {
      w.str(f.name);
      w.raw(v);
    }
  }
  return w.take();
}

void encode_cleared(msgpack::Writer& w, EventFormat f) {
  if (f == EventFormat::array) {
    w.array(1);
  } else {
    w.map(1);
    w.str("type");
  }
  w.str("AllBlocksCleared");
}

std::string encode_batch(double ts, std::string_view events, std::uint32_t count, EventFormat f) {
  msgpack::Writer w;
  if (f == EventFormat::map) {
    w.map(2);
    w.str("ts");
    w.float64(ts);
    w.str("events");
  } else {
    w.array(2);
    w.float64(ts);
  }
  w.array(count);
  w.raw(events);
  return w.take();
}

}  // namespace kvstrand::server
