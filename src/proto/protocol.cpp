#include "proto/protocol.hpp"

#include "proto/wire.hpp"

namespace kvstrand::proto {

namespace {

constexpr std::size_t kMaxName = 4096;

const char* kTypeNames[] = {"?",       "hello",  "register", "unregister", "lookup", "release",
                            "reserve", "commit", "end_session", "stats", "ping", "adopt", "drop", "drop_tenant"};

// ---- building blocks --------------------------------------------------------

void put(wire::Writer& w, const std::vector<ChunkKey>& keys) {
  w.u32(static_cast<std::uint32_t>(keys.size()));
  for (const ChunkKey& k : keys) wire::put_key(w, k);
}
std::vector<ChunkKey> get_keys(wire::Reader& r) {
  std::vector<ChunkKey> keys(r.count(wire::kKeyBytes));
  for (ChunkKey& k : keys) k = wire::get_key(r);
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

void put(wire::Writer& w, const std::vector<std::uint64_t>& v) {
  w.u32(static_cast<std::uint32_t>(v.size()));
  for (std::uint64_t x : v) w.u64(x);
}
std::vector<std::uint64_t> get_u64s(wire::Reader& r) {
  std::vector<std::uint64_t> v(r.count(8));
  for (std::uint64_t& x : v) x = r.u64();
  return v;
}
void put(wire::Writer& w, const std::vector<std::uint8_t>& v) {
  w.u32(static_cast<std::uint32_t>(v.size()));
  for (std::uint8_t x : v) w.u8(x);
}
// Bytes each at most `max`.
std::vector<std::uint8_t> get_u8s(wire::Reader& r, std::uint8_t max) {
  std::vector<std::uint8_t> v(r.count(1));
  for (std::uint8_t& x : v) {
    x = r.u8();
    if (x > max) r.fail();
  }
  return v;
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

std::vector<std::byte> framed(std::uint16_t type, std::uint64_t request_id, wire::Writer& w,
                              std::uint8_t major = kMajor) {
  std::vector<std::byte> out = w.take();
  Header h;
  h.major = major;
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
    case Status::unknown_hold: return "unknown_hold";
    case Status::over_quota: return "over_quota";
    case Status::not_authorized: return "not_authorized";
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
                               [](const Release&) { return Type::release; },
                               [](const Reserve&) { return Type::reserve; },
                               [](const Commit&) { return Type::commit; },
                               [](const EndSession&) { return Type::end_session; },
                               [](const Stats&) { return Type::stats; },
                               [](const Ping&) { return Type::ping; },
                               [](const Adopt&) { return Type::adopt; },
                               [](const Drop&) { return Type::drop; },
                               [](const DropTenant&) { return Type::drop_tenant; }},
                    r);
}

std::vector<std::byte> encode_request(const Request& req, std::uint64_t request_id) {
  wire::Writer w = body_writer();
  std::visit(Overloaded{[&](const Hello& m) {
                          w.u8(m.major);
                          w.u8(m.minor);
                          w.str(m.client);
                          if (!m.reads.empty()) w.str(m.reads);
                        },
                        [&](const RegisterLayout& m) {
                          put(w, m.layout);
                          // 2.4: the tenant after the layout, only when there is one;
                          // 2.5: then the weight version, only when there is one
                          // (the tenant then sent even when empty).
                          if (!m.layout.tenant.empty() || !m.layout.weight_version.empty()) w.str(m.layout.tenant);
                          if (!m.layout.weight_version.empty()) w.str(m.layout.weight_version);
                        },
                        [&](const Unregister& m) { w.u32(m.registration); },
                        [&](const Lookup& m) {
                          w.u32(m.registration);
                          put(w, m.keys);
                        },
                        [&](const Release& m) { w.u64(m.hold); },
                        [&](const Reserve& m) {
                          w.u32(m.registration);
                          put(w, m.keys);
                          put(w, m.images);
                          if (m.events.empty()) return;
                          w.u32(static_cast<std::uint32_t>(m.events.size()));
                          for (const std::string& e : m.events) w.str(e);
                        },
                        [&](const Commit& m) {
                          w.u64(m.hold);
                          w.u8(m.ok ? 1 : 0);
                        },
                        [&](const Adopt& m) {
                          w.u32(m.registration);
                          w.u64(m.lease);
                          put(w, m.keys);
                        },
                        [&](const Drop& m) { w.bytes(m.ns); },
                        [&](const DropTenant& m) { w.str(m.tenant); },
                        [](const EndSession&) {}, [](const Stats&) {}, [](const Ping&) {}},
             req);
  return framed(static_cast<std::uint16_t>(type_of(req)), request_id, w);
}

common::Expected<Request> decode_request(std::uint16_t type, std::span<const std::byte> body) {
  wire::Reader r(body);
  Request out;
  switch (static_cast<Type>(type)) {
    case Type::hello: {
      Hello m;
      m.major = r.u8();
      m.minor = r.u8();
      m.client = r.str(256);
      if (r.remaining() > 0) {
        m.reads = r.str(kv::kMaxTenantName);
        if (r.ok() && m.reads.empty()) r.fail();  // sent only when there is one
      }
      out = std::move(m);
      break;
    }
    case Type::register_layout: {
      RegisterLayout m{get_layout(r)};
      if (r.remaining() > 0) {
        m.layout.tenant = r.str(kv::kMaxTenantName);
        if (r.remaining() > 0) {
          m.layout.weight_version = r.str(kMaxName);
          if (r.ok() && m.layout.weight_version.empty()) r.fail();  // sent only when there is one
        } else if (r.ok() && m.layout.tenant.empty()) {
          r.fail();  // an empty tenant is sent only before a weight version: one encoding each
        }
      }
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
    case Type::release: out = Release{r.u64()}; break;
    case Type::reserve: {
      Reserve m;
      m.registration = r.u32();
      m.keys = get_keys(r);
      m.images = get_u8s(r, 1);
      if (r.remaining() > 0) {
        m.events.resize(r.count(4));
        for (std::string& e : m.events) e = r.str(kMaxChunkEvent);
        // One per key; an empty list is never sent (none: no count at all),
        // so each reserve has one encoding.
        if (r.ok() && (m.events.empty() || m.events.size() != m.keys.size())) r.fail();
      }
      out = std::move(m);
      break;
    }
    case Type::commit: {
      Commit m;
      m.hold = r.u64();
      const std::uint8_t ok = r.u8();
      if (ok > 1) r.fail();
      m.ok = ok == 1;
      out = m;
      break;
    }
    case Type::end_session: out = EndSession{}; break;
    case Type::stats: out = Stats{}; break;
    case Type::ping: out = Ping{}; break;
    case Type::adopt: {
      Adopt m;
      m.registration = r.u32();
      m.lease = r.u64();
      m.keys = get_keys(r);
      out = std::move(m);
      break;
    }
    case Type::drop_tenant: out = DropTenant{r.str(kv::kMaxTenantName)}; break;
    case Type::drop: {
      Drop m;
      r.bytes(m.ns);
      out = m;
      break;
    }
    default:
      return common::unexpected("unknown request type " + std::to_string(type));
  }
  if (!r.ok()) {
    return common::unexpected(std::string("truncated or malformed ") + to_string(static_cast<Type>(type)) + " request");
  }
  if (!r.done()) {
    return common::unexpected(std::to_string(r.remaining()) + " unexpected bytes after a " + to_string(static_cast<Type>(type)) +
           " request");
  }
  return out;
}

// ---- replies ----------------------------------------------------------------

std::vector<std::byte> encode_reply(Type type, std::uint64_t request_id, const Reply& rep, std::uint8_t major) {
  wire::Writer w = body_writer();
  w.u16(static_cast<std::uint16_t>(rep.status));
  w.str(rep.message);
  if (rep.status == Status::ok) {
    std::visit(Overloaded{[](const Empty&) {},
                          [&](const HelloReply& m) {
                            w.u64(m.session);
                            w.u8(m.major);
                            w.u8(m.minor);
                            w.u64(m.arena_bytes);
                            w.u64(m.slab_bytes);
                            w.u64(m.ready_bytes);
                            w.u8(m.huge_pages ? 1 : 0);
                            if (m.server_id != 0) w.u64(m.server_id);  // 2.2; a 2.1 client is sent none
                          },
                          [&](const RegisterReply& m) {
                            w.u32(m.registration);
                            w.u64(m.object_bytes);
                          },
                          [&](const LookupReply& m) {
                            w.u64(m.lease);
                            put(w, m.hit);
                            put(w, m.offsets);
                          },
                          [&](const ReserveReply& m) {
                            w.u64(m.reservation);
                            w.u32(static_cast<std::uint32_t>(m.chunks.size()));
                            for (ChunkState c : m.chunks) w.u8(static_cast<std::uint8_t>(c));
                            put(w, m.offsets);
                          },
                          [&](const StatsReply& m) {
                            for (std::uint64_t v : {m.capacity_bytes, m.ready_bytes, m.used_bytes, m.objects, m.pinned,
                                                    m.evictions, m.sessions, m.leases, m.reservations, m.refused_full})
                              w.u64(v);
                          },
                          [&](const DropReply& m) {
                            w.u64(m.arena_objects);
                            w.u64(m.lower_objects);
                          }},
               rep.payload);
  }
  return framed(static_cast<std::uint16_t>(static_cast<std::uint16_t>(type) | kReplyBit), request_id, w, major);
}

common::Expected<Reply> decode_reply(std::uint16_t type, std::span<const std::byte> body) {
  if ((type & kReplyBit) == 0) {
    return common::unexpected("not a reply");
  }
  wire::Reader r(body);
  Reply rep;
  const std::uint16_t status = r.u16();
  if (status > kLastStatus) r.fail();
  rep.status = static_cast<Status>(status);
  rep.message = r.str(64 * 1024);
  if (r.ok() && rep.status == Status::ok) {
    switch (static_cast<Type>(type & ~kReplyBit)) {
      case Type::hello: {
        HelloReply m;
        m.session = r.u64();
        m.major = r.u8();
        m.minor = r.u8();
        m.arena_bytes = r.u64();
        m.slab_bytes = r.u64();
        m.ready_bytes = r.u64();
        const std::uint8_t huge = r.u8();
        if (huge > 1) r.fail();
        m.huge_pages = huge == 1;
        if (r.ok() && r.remaining() >= 8) m.server_id = r.u64();  // 2.2: absent from a 2.1 server
        rep.payload = m;
        break;
      }
      case Type::register_layout: {
        RegisterReply m;
        m.registration = r.u32();
        m.object_bytes = r.u64();
        rep.payload = m;
        break;
      }
      case Type::lookup:
      case Type::adopt: {
        LookupReply m;
        m.lease = r.u64();
        m.hit = get_hit(r);
        m.offsets = get_u64s(r);
        rep.payload = std::move(m);
        break;
      }
      case Type::reserve: {
        ReserveReply m;
        m.reservation = r.u64();
        for (std::uint8_t c : get_u8s(r, 2)) m.chunks.push_back(static_cast<ChunkState>(c));
        m.offsets = get_u64s(r);
        if (m.offsets.size() != m.chunks.size()) r.fail();
        rep.payload = std::move(m);
        break;
      }
      case Type::stats: {
        StatsReply m;
        for (std::uint64_t* v : {&m.capacity_bytes, &m.ready_bytes, &m.used_bytes, &m.objects, &m.pinned,
                                 &m.evictions, &m.sessions, &m.leases, &m.reservations, &m.refused_full})
          *v = r.u64();
        rep.payload = m;
        break;
      }
      case Type::drop:
      case Type::drop_tenant: {
        DropReply m;
        m.arena_objects = r.u64();
        m.lower_objects = r.u64();
        rep.payload = m;
        break;
      }
      case Type::unregister:
      case Type::release:
      case Type::commit:
      case Type::end_session:
      case Type::ping: break;
      default:
        return common::unexpected("reply to unknown request type " + std::to_string(type & ~kReplyBit));
    }
  }
  if (!r.ok() || !r.done()) {
    return common::unexpected("truncated or malformed reply");
  }
  return rep;
}

}  // namespace kvstrand::proto
