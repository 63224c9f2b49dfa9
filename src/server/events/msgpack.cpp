#include "server/events/msgpack.hpp"

#include <bit>
#include <cstring>

namespace kvstrand::server::msgpack {

void Writer::be(std::uint64_t v, int n) {
  for (int i = n - 1; i >= 0; --i) byte(static_cast<std::uint8_t>(v >> (8 * i)));
}

void Writer::uint(std::uint64_t v) {
  if (v < 0x80) {
    byte(static_cast<std::uint8_t>(v));
  } else if (v <= 0xff) {
    byte(0xcc), byte(static_cast<std::uint8_t>(v));
  } else if (v <= 0xffff) {
    byte(0xcd), be(v, 2);
  } else if (v <= 0xffffffffu) {
    byte(0xce), be(v, 4);
  } else {
    byte(0xcf), be(v, 8);
  }
}

void Writer::sint(std::int64_t v) {
  if (v >= 0) return uint(static_cast<std::uint64_t>(v));
  if (v >= -32) return byte(static_cast<std::uint8_t>(v));
  const auto u = static_cast<std::uint64_t>(v);
  if (v >= INT8_MIN) return byte(0xd0), be(u, 1);
  if (v >= INT16_MIN) return byte(0xd1), be(u, 2);
  if (v >= INT32_MIN) return byte(0xd2), be(u, 4);
  byte(0xd3), be(u, 8);
}

void Writer::float64(double v) {
  byte(0xcb);
  be(std::bit_cast<std::uint64_t>(v), 8);
}

void Writer::header(std::uint32_t n, std::uint8_t fix, std::uint8_t fix_max, std::uint8_t b16, std::uint8_t b32) {
  if (n <= fix_max) {
    byte(static_cast<std::uint8_t>(fix | n));
  } else if (n <= 0xffff) {
    byte(b16), be(n, 2);
  } else {
    byte(b32), be(n, 4);
  }
}

void Writer::str(std::string_view s) {
  if (s.size() <= 31) {
    byte(static_cast<std::uint8_t>(0xa0 | s.size()));
  } else if (s.size() <= 0xff) {
    byte(0xd9), byte(static_cast<std::uint8_t>(s.size()));
  } else {
    header(static_cast<std::uint32_t>(s.size()), 0, 0, 0xda, 0xdb);
  }
  out_.append(s);
}

void Writer::array(std::uint32_t n) { header(n, 0x90, 15, 0xdc, 0xdd); }
void Writer::map(std::uint32_t n) { header(n, 0x80, 15, 0xde, 0xdf); }

namespace {

constexpr int kMaxDepth = 32;

struct Cursor {
  std::string_view in;
  std::size_t at = 0;
  bool ok = true;

  std::uint64_t be(int n) {
    if (!ok || in.size() - at < static_cast<std::size_t>(n)) {
      ok = false;
      return 0;
    }
    std::uint64_t v = 0;
    for (int i = 0; i < n; ++i) v = (v << 8) | static_cast<std::uint8_t>(in[at + i]);
    at += static_cast<std::size_t>(n);
    return v;
  }
  void take(std::uint64_t n) {
    if (!ok || in.size() - at < n) {
      ok = false;
      return;
    }
    at += static_cast<std::size_t>(n);
  }
  // One value (and, for a container, everything in it).
  void value(int depth) {
    if (!ok || depth > kMaxDepth || at >= in.size()) {
      ok = false;
      return;
    }
    const auto b = static_cast<std::uint8_t>(in[at++]);
    std::uint64_t items = 0;  // values inside a container
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) return;
    if (b >= 0xa0 && b <= 0xbf) return take(b & 0x1f);
    if (b >= 0x90 && b <= 0x9f) {
      items = b & 0x0f;
    } else if (b >= 0x80 && b <= 0x8f) {
      items = 2 * (b & 0x0f);
    } else {
      switch (b) {
        case 0xcc: case 0xd0: return take(1);
        case 0xcd: case 0xd1: return take(2);
        case 0xce: case 0xd2: case 0xca: return take(4);
        case 0xcf: case 0xd3: case 0xcb: return take(8);
        case 0xd9: case 0xc4: return take(be(1));
        case 0xda: case 0xc5: return take(be(2));
        case 0xdb: case 0xc6: return take(be(4));
        case 0xd4: return take(2);  // fixext: type and 1, 2, 4, 8, 16 bytes
        case 0xd5: return take(3);
        case 0xd6: return take(5);
        case 0xd7: return take(9);
        case 0xd8: return take(17);
        case 0xc7: return take(be(1) + 1);
        case 0xc8: return take(be(2) + 1);
        case 0xc9: return take(be(4) + 1);
        case 0xdc: items = be(2); break;
        case 0xdd: items = be(4); break;
        case 0xde: items = 2 * be(2); break;
        case 0xdf: items = 2 * be(4); break;
        default: ok = false; return;  // 0xc1: never used
      }
    }
    // Each item is at least a byte: a count the input cannot hold is refused
    // before it is walked.
    if (items > in.size() - at) ok = false;
    for (std::uint64_t i = 0; ok && i < items; ++i) value(depth + 1);
  }
};

// A container's header at the start of `v`: its count (pairs for a map).
std::optional<std::uint64_t> container(std::string_view v, bool map, std::size_t* body) {
  Cursor c{v};
  if (v.empty()) return std::nullopt;
  const auto b = static_cast<std::uint8_t>(v[0]);
  c.at = 1;
  std::uint64_t n = 0;
  if (!map && b >= 0x90 && b <= 0x9f) n = b & 0x0f;
  else if (map && b >= 0x80 && b <= 0x8f) n = b & 0x0f;
  else if (b == (map ? 0xde : 0xdc)) n = c.be(2);
  else if (b == (map ? 0xdf : 0xdd)) n = c.be(4);
  else return std::nullopt;
  if (!c.ok) return std::nullopt;
  *body = c.at;
  return n;
}

}  // namespace

std::optional<std::size_t> skip(std::string_view in, std::size_t at) {
  Cursor c{in, at};
  c.value(0);
  if (!c.ok) return std::nullopt;
  return c.at;
}

std::optional<std::vector<std::pair<std::string_view, std::string_view>>> read_map(std::string_view in) {
  if (skip(in) != in.size()) return std::nullopt;
  std::size_t at = 0;
  const auto n = container(in, true, &at);
  if (!n) return std::nullopt;
  std::vector<std::pair<std::string_view, std::string_view>> out;
  for (std::uint64_t i = 0; i < *n; ++i) {
    // Keys are strings, in any of their four forms (whole: skip() checked).
    const auto b = static_cast<std::uint8_t>(in[at]);
    Cursor c{in, at + 1};
    std::size_t len = 0;
    if (b >= 0xa0 && b <= 0xbf) len = b & 0x1f;
    else if (b == 0xd9) len = c.be(1);
    else if (b == 0xda) len = c.be(2);
    else if (b == 0xdb) len = c.be(4);
    else return std::nullopt;
    const std::size_t start = c.at;
    const std::string_view key = in.substr(start, len);
    const std::size_t value = start + len;
    const auto end = skip(in, value);
    if (!end) return std::nullopt;
    out.emplace_back(key, in.substr(value, *end - value));
    at = *end;
  }
  return out;
}

std::optional<std::uint32_t> array_length(std::string_view value) {
  std::size_t body = 0;
  const auto n = container(value, false, &body);
  if (!n) return std::nullopt;
  return static_cast<std::uint32_t>(*n);
}

bool is_nil(std::string_view value) { return value.size() == 1 && static_cast<std::uint8_t>(value[0]) == 0xc0; }

bool is_int(std::string_view value) {
  if (value.empty()) return false;
  const auto b = static_cast<std::uint8_t>(value[0]);
  return b <= 0x7f || b >= 0xe0 || (b >= 0xcc && b <= 0xd3);
}

bool is_bytes(std::string_view value) {
  if (value.empty()) return false;
  const auto b = static_cast<std::uint8_t>(value[0]);
  return b >= 0xc4 && b <= 0xc6;
}

bool is_str(std::string_view value) {
  if (value.empty()) return false;
  const auto b = static_cast<std::uint8_t>(value[0]);
  return (b >= 0xa0 && b <= 0xbf) || (b >= 0xd9 && b <= 0xdb);
}

std::optional<std::vector<std::string_view>> array_items(std::string_view value) {
  std::size_t at = 0;
  const auto n = container(value, false, &at);
  if (!n) return std::nullopt;
  std::vector<std::string_view> out;
  for (std::uint64_t i = 0; i < *n; ++i) {
    const auto end = skip(value, at);
    if (!end) return std::nullopt;
    out.push_back(value.substr(at, *end - at));
    at = *end;
  }
  return out;
}

}  // namespace kvstrand::server::msgpack
