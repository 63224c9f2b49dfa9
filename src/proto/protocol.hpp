// The kvstrand-server wire protocol, version 2.4: frames, messages, and
// their encoding. docs/protocol.md is the reference a client is written
// from; this file is its implementation, shared by the server and
// RemoteIndex. Pure: no I/O.
//
// Every decode is bounds-checked and refuses trailing bytes, counts the input
// cannot hold, strings over their limit and unknown types, so a malformed
// frame yields an error, never a crash (tests/proto/fuzz_frame_decoder.cpp).
#pragma once

#include "common/expected.hpp"
#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/hit_plan.hpp>
#include <kvstrand/layout.hpp>
#include <kvstrand/transfer_spec.hpp>

namespace kvstrand::proto {

using kv::ChunkKey;
using kv::Digest;
using kv::Layout;
using kv::HitSource;
using kv::Plane;

inline constexpr std::uint32_t kMagic = 0x5453564b;  // "KVST" on the wire
inline constexpr std::uint8_t kMajor = 2;
// 2.1: adopt; 2.2: the hello reply's server_id; 2.3: drop; 2.4: a reserve's
// chunk events, a registration's tenant; 2.5: a registration's weight
// version (the server checks each key's namespace against it); 2.6: a
// hello's `reads` (a session reading a published tenant's objects)
inline constexpr std::uint8_t kMinor = 6;
// A chunk's event description (Reserve::events) is at most this long.
inline constexpr std::size_t kMaxChunkEvent = 64u << 10;
inline constexpr std::size_t kHeaderBytes = 20;
inline constexpr std::uint32_t kDefaultMaxBody = 16u << 20;
inline constexpr std::uint16_t kReplyBit = 0x8000;

enum class Type : std::uint16_t {
  hello = 1,
  register_layout = 2,
  unregister = 3,
  lookup = 4,
  release = 5,
  reserve = 6,
  commit = 7,
  end_session = 8,
  stats = 9,
  ping = 10,
  adopt = 11,  // 2.1
  drop = 12,   // 2.3
  drop_tenant = 13,  // 2.4
};
const char* to_string(Type t) noexcept;

struct Header {
  std::uint8_t major = kMajor;
  std::uint8_t minor = kMinor;
  std::uint16_t type = 0;  // a Type, with kReplyBit set on replies
  std::uint64_t request_id = 0;
  std::uint32_t body_bytes = 0;
};

enum class HeaderError { none, bad_magic, other_major, too_large };

HeaderError decode_header(std::span<const std::byte> bytes, std::uint32_t max_body, Header* out);
std::array<std::byte, kHeaderBytes> encode_header(const Header& h);

// ---- requests ---------------------------------------------------------------

// Opens a session. The reply to a hello carries the arena's file descriptor
// (SCM_RIGHTS) with its first byte.
struct Hello {
  std::uint8_t major = kMajor;
  std::uint8_t minor = kMinor;
  std::string client;
  // 2.6, sent only when set: this session reads tenant `reads`'s objects
  // (--public-tenant) and stores nothing; the descriptor that comes with
  // the reply is that tenant's segment, read-only.
  std::string reads;
};
// The geometry only: the server never sees a client's device memory. 2.4:
// the layout's tenant, after it, when it has one (its objects are the
// tenant's, for --tenant-quota); 2.5: then its weight_version, when it has
// one, so that the server knows the registration's whole namespace.
struct RegisterLayout {
  Layout layout;
};
struct Unregister {
  std::uint32_t registration = 0;
};
// The longest stored run from keys[0]; its objects stay leased (never
// evicted or moved) until released.
struct Lookup {
  std::uint32_t registration = 0;
  std::vector<ChunkKey> keys;
};
// Ends a lease, or a reservation (what it did not commit is freed). From
// any session of the server's user.
struct Release {
  std::uint64_t hold = 0;
};
// Places for the chunks not stored yet; images[i]: chunk i carries a
// checkpoint image. 2.4: events, none or one per key, chunk i's
// description for the server's KV events (docs/events.md), kept with its
// object; encoded after images only when there are some, so a reserve
// without them is the 2.3 one.
struct Reserve {
  std::uint32_t registration = 0;
  std::vector<ChunkKey> keys;
  std::vector<std::uint8_t> images;
  std::vector<std::string> events = {};
};
// Ends a reservation: its objects become readable (ok) or are freed.
struct Commit {
  std::uint64_t hold = 0;
  bool ok = true;
};
// Makes another process's lease this session's process's (a scheduler's
// lookup handed to the worker that loads it). The lease must hold exactly
// `keys`, of this registration's objects. Replied like a lookup.
struct Adopt {
  std::uint32_t registration = 0;
  std::uint64_t lease = 0;
  std::vector<ChunkKey> keys;
};
// Drops every object of a namespace on the node (an online weight
// update): the arena's and the disk's; none is found by a lookup after the
// reply. Objects held then stay readable to their holders until released.
struct Drop {
  Digest ns{};
};
// Drops every namespace a tenant's objects on this node belong to (2.4):
// each as a Drop does, L2's values of them included. A namespace of the
// tenant that the node holds nothing of (only L2 does) is not found:
// drop it by namespace.
struct DropTenant {
  std::string tenant;
};
struct EndSession {};
struct Stats {};
struct Ping {};

using Request = std::variant<Hello, RegisterLayout, Unregister, Lookup, Release, Reserve, Commit, EndSession, Stats,
                             Ping, Adopt, Drop, DropTenant>;

Type type_of(const Request& r) noexcept;
std::vector<std::byte> encode_request(const Request& r, std::uint64_t request_id);
// Decodes a request body of a frame of type `type`, or says why it cannot.
common::Expected<Request> decode_request(std::uint16_t type, std::span<const std::byte> body);

// ---- replies ----------------------------------------------------------------

enum class Status : std::uint16_t {
  ok = 0,
  refused_version = 1,       // another major version; the connection closes
  bad_request = 2,           // undecodable, inconsistent with itself, or out of order
  unknown_registration = 3,
  unknown_hold = 4,          // no live lease or reservation of that id
  over_quota = 5,            // the session's bound on held bytes would be passed; nothing held
  not_authorized = 6,        // the peer is not the server's user
};
inline constexpr std::uint16_t kLastStatus = 6;
const char* to_string(Status s) noexcept;

struct HelloReply {
  std::uint64_t session = 0;
  std::uint8_t major = kMajor;
  std::uint8_t minor = kMinor;
  std::uint64_t arena_bytes = 0;  // the whole arena (the size of the file that comes with this reply)
  std::uint64_t slab_bytes = 0;
  std::uint64_t ready_bytes = 0;  // slabs populated so far
  bool huge_pages = false;
  // 2.2: this server's life (random at its start), sent to clients of 2.2
  // and later: a client that reconnects tells a restarted server (whose
  // hold ids mean other holds) from the same one. 0: not said (a 2.1 server).
  std::uint64_t server_id = 0;
};
struct RegisterReply {
  std::uint32_t registration = 0;
  std::uint64_t object_bytes = 0;  // every object in the arena has this size
};
struct LookupReply {
  std::uint64_t lease = 0;  // 0: nothing held
  HitSource hit;
  std::vector<std::uint64_t> offsets;  // arena offset of each chunk of the hit
};
enum class ChunkState : std::uint8_t { reserved = 0, existed = 1, full = 2 };
struct ReserveReply {
  std::uint64_t reservation = 0;  // 0: nothing reserved
  std::vector<ChunkState> chunks;  // one per key
  std::vector<std::uint64_t> offsets;  // one per key; where to copy a reserved chunk
};
struct StatsReply {
  std::uint64_t capacity_bytes = 0;  // --tier-bytes
  std::uint64_t ready_bytes = 0;     // slabs populated
  std::uint64_t used_bytes = 0;
  std::uint64_t objects = 0;
  std::uint64_t pinned = 0;
  std::uint64_t evictions = 0;
  std::uint64_t sessions = 0;
  std::uint64_t leases = 0;
  std::uint64_t reservations = 0;
  std::uint64_t refused_full = 0;
};
struct DropReply {
  std::uint64_t arena_objects = 0;  // dropped from the arena
  std::uint64_t lower_objects = 0;  // dropped from the levels below (the disk)
};
struct Empty {};

using Payload = std::variant<Empty, HelloReply, RegisterReply, LookupReply, ReserveReply, StatsReply, DropReply>;

struct Reply {
  Status status = Status::ok;
  std::string message;  // what went wrong, for a person
  Payload payload;      // meaningful when status is ok
};

// A reply refusing a request: its status and, for a person, why.
inline Reply fail(Status s, std::string message) { return Reply{s, std::move(message), Empty{}}; }

// `major`: the header's version. A refused_version reply carries the
// client's own, so a client of another major version can read it.
std::vector<std::byte> encode_reply(Type type, std::uint64_t request_id, const Reply& r, std::uint8_t major = kMajor);
common::Expected<Reply> decode_reply(std::uint16_t type, std::span<const std::byte> body);

}  // namespace kvstrand::proto
