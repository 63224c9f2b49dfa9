#include "kv/protocol.hpp"

#include "kv/wire.hpp"

namespace kvstrand::kv::proto {

namespace {

constexpr std::size_t kKeyBytes = 32 + 4 + 32;
constexpr std::size_t kMaxName = 4096;

const char* kTypeNames[] = {"?",     "hello", "register", "unregister", "lookup", "free_locks",
                            "store", "retrieve", "end_session", "stats", "ping"};

// ---- building blocks --------------------------------------------------------

void put(wire::Writer& w, const ChunkKey& k) {
  w.bytes(k.ns);
  w.u32(k.kv_rank);
  w.bytes(k.hash);
}
ChunkKey get_key(wire::Reader& r) {
  ChunkKey k;
  r.bytes(k.ns);
  k.kv_rank = r.u32();
  r.bytes(k.hash);
  return k;
}

void put(wire::Writer& w, const std::vector<ChunkKey>& keys) {
  w.u32(static_cast<std::uint32_t>(keys.size()));
  for (const ChunkKey& k : keys) put(w, k);
}
std::vector<ChunkKey> get_keys(wire::Reader& r) {
  std::vector<ChunkKey> keys(r.count(kKeyBytes));
  for (ChunkKey& k : keys) k = get_key(r);
  return keys;
}

void put(wire::Writer& w, const Layout& l) {
  w.str(l.model_id);
  w.str(l.layout_name);
  w.u32(l.layout_version);
  w.u32(static_cast<std::uint32_t>(l.planes.size()));
  for (const Plane& p : l.planes) {
    w.str(p.name);
    w.u64(p.bytes_per_block);
  }
  w.u32(l.block_tokens);
  w.u32(l.chunk_tokens);
  w.u32(l.sliding_window);
  w.str(l.checkpoint.kind);
  w.u64(l.checkpoint.image_bytes);
  w.u32(l.checkpoint.interval_tokens);
  w.str(l.speculative.method);
  w.u32(l.speculative.num_tokens);
  w.u32(static_cast<std::uint32_t>(l.speculative.params.size()));
  for (const auto& [k, v] : l.speculative.params) {
    w.str(k);
    w.str(v);
  }
  w.str(l.dtype);
  w.str(l.tenant_salt);
  w.u32(l.tp_size);
  w.u32(l.tp_rank);
  w.u8(l.replicated_across_tp ? 1 : 0);
}
Layout get_layout(wire::Reader& r) {
  Layout l;
  l.model_id = r.str(kMaxName);
  l.layout_name = r.str(kMaxName);
  l.layout_version = r.u32();
  l.planes.resize(r.count(4 + 8));
  for (Plane& p : l.planes) {
    p.name = r.str(kMaxName);
    p.bytes_per_block = r.u64();
  }
  l.block_tokens = r.u32();
  l.chunk_tokens = r.u32();
  l.sliding_window = r.u32();
  l.checkpoint.kind = r.str(kMaxName);
  l.checkpoint.image_bytes = r.u64();
  l.checkpoint.interval_tokens = r.u32();
  l.speculative.method = r.str(kMaxName);
  l.speculative.num_tokens = r.u32();
  l.speculative.params.resize(r.count(4 + 4));
  for (auto& [k, v] : l.speculative.params) {
    k = r.str(kMaxName);
    v = r.str(kMaxName);
  }
  l.dtype = r.str(kMaxName);
  l.tenant_salt = r.str(kMaxName);
  l.tp_size = r.u32();
  l.tp_rank = r.u32();
  const std::uint8_t rep = r.u8();
  if (rep > 1) r.fail();
  l.replicated_across_tp = rep == 1;
  return l;
}

void put(wire::Writer& w, const MemoryHandle& m) {
  w.bytes(m.handle);
  w.u64(m.offset);
  w.u32(m.count);
}
MemoryHandle get_memory(wire::Reader& r) {
  MemoryHandle m;
  r.bytes(m.handle);
  m.offset = r.u64();
  m.count = r.u32();
  return m;
}

void put(wire::Writer& w, const TransferSpec& s) {
  w.str(s.request);
  w.u32(s.tokens.begin);
  w.u32(s.tokens.end);
  put(w, s.keys);
  w.u32(static_cast<std::uint32_t>(s.blocks.size()));
  for (BlockId b : s.blocks) w.u32(b);
  w.u8(s.with_state ? 1 : 0);
  w.u32(static_cast<std::uint32_t>(s.state_slots.size()));
  for (std::int32_t slot : s.state_slots) w.u32(static_cast<std::uint32_t>(slot));
}
TransferSpec get_spec(wire::Reader& r) {
  TransferSpec s;
  s.request = r.str(1024);
  s.tokens.begin = r.u32();
  s.tokens.end = r.u32();
  s.keys = get_keys(r);
  s.blocks.resize(r.count(4));
  for (BlockId& b : s.blocks) b = r.u32();
  const std::uint8_t st = r.u8();
  if (st > 1) r.fail();
  s.with_state = st == 1;
  s.state_slots.resize(r.count(4));
  for (std::int32_t& slot : s.state_slots) slot = static_cast<std::int32_t>(r.u32());
  return s;
}

void put(wire::Writer& w, const HitSource& h) {
  w.u32(h.tokens);
  w.u32(static_cast<std::uint32_t>(h.checkpoints.size()));
  for (std::uint32_t c : h.checkpoints) w.u32(c);
}
HitSource get_hit(wire::Reader& r) {
  HitSource h;
  h.tokens = r.u32();
  h.checkpoints.resize(r.count(4));
  for (std::uint32_t& c : h.checkpoints) c = r.u32();
  return h;
}

// Bodies are written after a header-sized gap that framed() fills in.
wire::Writer body_writer() {
  wire::Writer w;
  w.buffer().resize(kHeaderBytes);
  return w;
}

std::vector<std::byte> framed(std::uint16_t type, std::uint64_t request_id, wire::Writer& w) {
  std::vector<std::byte> out = w.take();
  Header h;
  h.type = type;
  h.request_id = request_id;
  h.body_bytes = static_cast<std::uint32_t>(out.size() - kHeaderBytes);
  const auto head = encode_header(h);
  for (std::size_t i = 0; i < kHeaderBytes; ++i) out[i] = head[i];
  return out;
}

template <class... F>
struct Overloaded : F... {
  using F::operator()...;
};
template <class... F>
Overloaded(F...) -> Overloaded<F...>;  // clang 14 has no aggregate deduction

}  // namespace

const char* to_string(Type t) noexcept {
  const auto i = static_cast<std::size_t>(t);
  return i < std::size(kTypeNames) ? kTypeNames[i] : "?";
}

const char* to_string(Status s) noexcept {
  switch (s) {
    case Status::ok: return "ok";
    case Status::refused_version: return "refused_version";
    case Status::bad_request: return "bad_request";
    case Status::unknown_registration: return "unknown_registration";
    case Status::out_of_range: return "out_of_range";
    case Status::tier_full: return "tier_full";
    case Status::missing_chunk: return "missing_chunk";
    case Status::lock_expired: return "lock_expired";
    case Status::device_error: return "device_error";
    case Status::not_authorized: return "not_authorized";
    case Status::internal: return "internal";
  }
  return "?";
}

// ---- header -----------------------------------------------------------------

std::array<std::byte, kHeaderBytes> encode_header(const Header& h) {
  std::array<std::byte, kHeaderBytes> out{};
  auto le = [&out](std::size_t at, std::uint64_t v, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) out[at + i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
  };
  le(0, kMagic, 4);
  le(4, h.major, 1);
  le(5, h.minor, 1);
  le(6, h.type, 2);
  le(8, h.request_id, 8);
  le(16, h.body_bytes, 4);
  return out;
}

HeaderError decode_header(std::span<const std::byte> bytes, std::uint32_t max_body, Header* out) {
  wire::Reader r(bytes.first(std::min(bytes.size(), kHeaderBytes)));
  if (r.u32() != kMagic || bytes.size() < kHeaderBytes) return HeaderError::bad_magic;
  out->major = r.u8();
  out->minor = r.u8();
  out->type = r.u16();
  out->request_id = r.u64();
  out->body_bytes = r.u32();
  if (out->major != kMajor) return HeaderError::other_major;
  if (out->body_bytes > max_body) return HeaderError::too_large;
  return HeaderError::none;
}

// ---- requests ---------------------------------------------------------------

Type type_of(const Request& r) noexcept {
  return std::visit(Overloaded{[](const Hello&) { return Type::hello; },
                               [](const RegisterLayout&) { return Type::register_layout; },
                               [](const Unregister&) { return Type::unregister; },
                               [](const Lookup&) { return Type::lookup; },
                               [](const FreeLocks&) { return Type::free_locks; },
                               [](const Store&) { return Type::store; },
                               [](const Retrieve&) { return Type::retrieve; },
                               [](const EndSession&) { return Type::end_session; },
                               [](const Stats&) { return Type::stats; },
                               [](const Ping&) { return Type::ping; }},
                    r);
}

std::vector<std::byte> encode_request(const Request& req, std::uint64_t request_id) {
  wire::Writer w = body_writer();
  std::visit(Overloaded{[&](const Hello& m) {
                          w.u8(m.major);
                          w.u8(m.minor);
                          w.str(m.client);
                        },
                        [&](const RegisterLayout& m) {
                          put(w, m.layout);
                          w.u32(static_cast<std::uint32_t>(m.planes.size()));
                          for (const MemoryHandle& p : m.planes) put(w, p);
                          put(w, m.state);
                        },
                        [&](const Unregister& m) { w.u32(m.registration); },
                        [&](const Lookup& m) {
                          w.u32(m.registration);
                          put(w, m.keys);
                        },
                        [&](const FreeLocks& m) { w.u64(m.lock); },
                        [&](const Store& m) {
                          w.u32(m.registration);
                          put(w, m.spec);
                        },
                        [&](const Retrieve& m) {
                          w.u32(m.registration);
                          w.u64(m.lock);
                          put(w, m.spec);
                        },
                        [](const EndSession&) {}, [](const Stats&) {}, [](const Ping&) {}},
             req);
  return framed(static_cast<std::uint16_t>(type_of(req)), request_id, w);
}

std::optional<Request> decode_request(std::uint16_t type, std::span<const std::byte> body, std::string* why) {
  wire::Reader r(body);
  Request out;
  switch (static_cast<Type>(type)) {
    case Type::hello: {
      Hello m;
      m.major = r.u8();
      m.minor = r.u8();
      m.client = r.str(256);
      out = std::move(m);
      break;
    }
    case Type::register_layout: {
      RegisterLayout m;
      m.layout = get_layout(r);
      m.planes.resize(r.count(kIpcHandleBytes + 12));
      for (MemoryHandle& p : m.planes) p = get_memory(r);
      m.state = get_memory(r);
      out = std::move(m);
      break;
    }
    case Type::unregister: out = Unregister{r.u32()}; break;
    case Type::lookup: {
      Lookup m;
      m.registration = r.u32();
      m.keys = get_keys(r);
      out = std::move(m);
      break;
    }
    case Type::free_locks: out = FreeLocks{r.u64()}; break;
    case Type::store: {
      Store m;
      m.registration = r.u32();
      m.spec = get_spec(r);
      out = std::move(m);
      break;
    }
    case Type::retrieve: {
      Retrieve m;
      m.registration = r.u32();
      m.lock = r.u64();
      m.spec = get_spec(r);
      out = std::move(m);
      break;
    }
    case Type::end_session: out = EndSession{}; break;
    case Type::stats: out = Stats{}; break;
    case Type::ping: out = Ping{}; break;
    default:
      *why = "unknown request type " + std::to_string(type);
      return std::nullopt;
  }
  if (!r.ok()) {
    *why = std::string("truncated or malformed ") + to_string(static_cast<Type>(type)) + " request";
    return std::nullopt;
  }
  if (!r.done()) {
    *why = std::to_string(r.remaining()) + " unexpected bytes after a " + to_string(static_cast<Type>(type)) +
           " request";
    return std::nullopt;
  }
  return out;
}

// ---- replies ----------------------------------------------------------------

std::vector<std::byte> encode_reply(Type type, std::uint64_t request_id, const Reply& rep) {
  wire::Writer w = body_writer();
  w.u16(static_cast<std::uint16_t>(rep.status));
  w.str(rep.message);
  if (rep.status == Status::ok) {
    std::visit(Overloaded{[](const Empty&) {},
                          [&](const HelloReply& m) {
                            w.u64(m.session);
                            w.u8(m.major);
                            w.u8(m.minor);
                          },
                          [&](const RegisterReply& m) { w.u32(m.registration); },
                          [&](const LookupReply& m) {
                            w.u64(m.lock);
                            put(w, m.hit);
                          },
                          [&](const StoreReply& m) {
                            w.u32(m.stored);
                            w.u32(m.existed);
                            w.u32(m.refused);
                          },
                          [&](const StatsReply& m) {
                            for (std::uint64_t v : {m.capacity_bytes, m.used_bytes, m.objects, m.pinned, m.evictions,
                                                    m.sessions, m.locks})
                              w.u64(v);
                          }},
               rep.payload);
  }
  return framed(static_cast<std::uint16_t>(static_cast<std::uint16_t>(type) | kReplyBit), request_id, w);
}

std::optional<Reply> decode_reply(std::uint16_t type, std::span<const std::byte> body, std::string* why) {
  if ((type & kReplyBit) == 0) {
    *why = "not a reply";
    return std::nullopt;
  }
  wire::Reader r(body);
  Reply rep;
  const std::uint16_t status = r.u16();
  if (status > static_cast<std::uint16_t>(Status::internal)) r.fail();
  rep.status = static_cast<Status>(status);
  rep.message = r.str(64 * 1024);
  if (r.ok() && rep.status == Status::ok) {
    switch (static_cast<Type>(type & ~kReplyBit)) {
      case Type::hello: {
        HelloReply m;
        m.session = r.u64();
        m.major = r.u8();
        m.minor = r.u8();
        rep.payload = m;
        break;
      }
      case Type::register_layout: rep.payload = RegisterReply{r.u32()}; break;
      case Type::lookup: {
        LookupReply m;
        m.lock = r.u64();
        m.hit = get_hit(r);
        rep.payload = std::move(m);
        break;
      }
      case Type::store: {
        StoreReply m;
        m.stored = r.u32();
        m.existed = r.u32();
        m.refused = r.u32();
        rep.payload = m;
        break;
      }
      case Type::stats: {
        StatsReply m;
        for (std::uint64_t* v : {&m.capacity_bytes, &m.used_bytes, &m.objects, &m.pinned, &m.evictions, &m.sessions,
                                 &m.locks})
          *v = r.u64();
        rep.payload = m;
        break;
      }
      case Type::unregister:
      case Type::free_locks:
      case Type::retrieve:
      case Type::end_session:
      case Type::ping: break;
      default:
        *why = "reply to unknown request type " + std::to_string(type & ~kReplyBit);
        return std::nullopt;
    }
  }
  if (!r.ok() || !r.done()) {
    *why = "truncated or malformed reply";
    return std::nullopt;
  }
  return rep;
}

}  // namespace kvstrand::kv::proto
