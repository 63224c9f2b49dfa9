// The kvstrand-server wire protocol, version 1.0: frames, messages, and
// their encoding. docs/protocol.md is the reference a client is written
// from; this file is its implementation, shared by the server and
// RemoteTier. Pure: no I/O.
//
// Every decode is bounds-checked and refuses trailing bytes, counts the input
// cannot hold, strings over their limit and unknown types, so a malformed
// frame yields an error, never a crash (tests/fuzz_frame_decoder.cpp).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "kv/chunk_keys.hpp"
#include "kv/hit_plan.hpp"
#include "kv/layout.hpp"
#include "kv/transfer_spec.hpp"

namespace kvstrand::kv::proto {

inline constexpr std::uint32_t kMagic = 0x5453564b;  // "KVST" on the wire
inline constexpr std::uint8_t kMajor = 1;
inline constexpr std::uint8_t kMinor = 0;
inline constexpr std::size_t kHeaderBytes = 20;
inline constexpr std::uint32_t kDefaultMaxBody = 16u << 20;
inline constexpr std::uint16_t kReplyBit = 0x8000;
inline constexpr std::size_t kIpcHandleBytes = 72;  // hip::IpcHandle::wire_size

enum class Type : std::uint16_t {
  hello = 1,
  register_layout = 2,
  unregister = 3,
  lookup = 4,
  free_locks = 5,
  store = 6,
  retrieve = 7,
  end_session = 8,
  stats = 9,
  ping = 10,
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

using IpcBytes = std::array<std::byte, kIpcHandleBytes>;

struct MemoryHandle {
  IpcBytes handle{};          // the exporting process's allocation
  std::uint64_t offset = 0;   // where block 0 (or slot 0) starts in it
  std::uint32_t count = 0;    // blocks (or state slots)
};

struct Hello {
  std::uint8_t major = kMajor;
  std::uint8_t minor = kMinor;
  std::string client;
};
struct RegisterLayout {
  Layout layout;
  std::vector<MemoryHandle> planes;  // one per layout plane
  MemoryHandle state;                // count 0 when the layout has no state
};
struct Unregister {
  std::uint32_t registration = 0;
};
struct Lookup {
  std::uint32_t registration = 0;
  std::vector<ChunkKey> keys;
};
struct FreeLocks {
  std::uint64_t lock = 0;
};
struct Store {
  std::uint32_t registration = 0;
  TransferSpec spec;
};
struct Retrieve {
  std::uint32_t registration = 0;
  std::uint64_t lock = 0;  // the lookup's locks to release after the copy (0: none)
  TransferSpec spec;
};
struct EndSession {};
struct Stats {};
struct Ping {};

using Request = std::variant<Hello, RegisterLayout, Unregister, Lookup, FreeLocks, Store, Retrieve, EndSession,
                             Stats, Ping>;

Type type_of(const Request& r) noexcept;
std::vector<std::byte> encode_request(const Request& r, std::uint64_t request_id);
// Decodes a request body of a frame of type `type`. On failure returns none
// and says why in `why`.
std::optional<Request> decode_request(std::uint16_t type, std::span<const std::byte> body, std::string* why);

// ---- replies ----------------------------------------------------------------

enum class Status : std::uint16_t {
  ok = 0,
  refused_version = 1,       // another major version
  bad_request = 2,           // undecodable, or inconsistent with itself
  unknown_registration = 3,
  out_of_range = 4,          // a block, slot, offset or length outside the registered memory
  tier_full = 5,
  missing_chunk = 6,
  lock_expired = 7,
  device_error = 8,
  not_authorized = 9,
  internal = 10,
};
const char* to_string(Status s) noexcept;

struct HelloReply {
  std::uint64_t session = 0;
  std::uint8_t major = kMajor;
  std::uint8_t minor = kMinor;
};
struct RegisterReply {
  std::uint32_t registration = 0;
};
struct LookupReply {
  std::uint64_t lock = 0;  // 0: nothing locked
  HitSource hit;
};
struct StoreReply {
  std::uint32_t stored = 0;
  std::uint32_t existed = 0;
  std::uint32_t refused = 0;
};
struct StatsReply {
  std::uint64_t capacity_bytes = 0;
  std::uint64_t used_bytes = 0;
  std::uint64_t objects = 0;
  std::uint64_t pinned = 0;
  std::uint64_t evictions = 0;
  std::uint64_t sessions = 0;
  std::uint64_t locks = 0;
};
struct Empty {};

using Payload = std::variant<Empty, HelloReply, RegisterReply, LookupReply, StoreReply, StatsReply>;

struct Reply {
  Status status = Status::ok;
  std::string message;  // what went wrong, for a person
  Payload payload;      // meaningful when status is ok
};

std::vector<std::byte> encode_reply(Type type, std::uint64_t request_id, const Reply& r);
std::optional<Reply> decode_reply(std::uint16_t type, std::span<const std::byte> body, std::string* why);

}  // namespace kvstrand::kv::proto
