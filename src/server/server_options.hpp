// kvstrand-server's command line: every flag validated at start-up, a bad
// value refused with a message naming the flag. Every flag is also a key of
// a --config file (TOML, or INI), where the command line wins;
// --print-config writes the options in force as such a file.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <variant>

#include "common/debug_http.hpp"
#include "server/levels/disk_tier.hpp"
#include "server/events/event_publisher.hpp"
#include "server/levels/l2_tier.hpp"
#include "server/peer_identity.hpp"

namespace kvstrand::server {

struct ServerOptions {
  std::string socket = "/tmp/kvstrand.sock";
  std::uint64_t tier_bytes = 8ull << 30;
  std::string tier_bytes_rounded_from;  // --tier-bytes as given, when it was rounded up to whole slabs
  std::uint64_t slab_bytes = 1ull << 30;  // the arena grows by this much at a time
  bool huge_pages = true;                 // where the system has them reserved
  // --arena-path: the arena as a named file on tmpfs or hugetlbfs that the
  // next server finds again with its objects (empty: a memfd of this
  // server's life only).
  std::string arena_path;
  std::uint32_t chunk_tokens = 256;
  std::string log_level = "info";
  std::uint32_t max_frame = 16u << 20;
  // Bounds on one client process: bytes its leases pin, bytes its
  // reservations hold (0: half and a quarter of the tier), and the replies
  // queued for one connection before the server stops reading from it.
  std::uint64_t max_client_leased = 0;
  std::uint64_t max_client_reserved = 0;
  std::uint64_t max_reply_queue = 4u << 20;
  // What one registration may cost the index (ServiceRules): objects of at
  // least min_object_bytes, a size class's index of at most max_index_bytes.
  std::uint64_t min_object_bytes = 512;
  std::uint64_t max_index_bytes = 1ull << 30;
  // Tenants told apart at most, the unnamed one and --tenant-quota's included.
  std::size_t max_tenants = 256;
  // --http ADDR:PORT: the read-only debug endpoint (off when unset).
  std::optional<common::HttpOptions> http;
  // --l2 redis://HOST:PORT[,...]: Redis (Cluster) under the arena (off when unset).
  std::optional<L2Options> l2;
  // --disk PATH... --disk-bytes N: local disks under the arena (off when unset).
  std::optional<DiskOptions> disk;
  // --tenant-quota NAME=BYTES (each a reserve too), --tenant-quota-default.
  std::map<std::string, std::uint64_t> tenant_quotas;
  std::optional<std::uint64_t> tenant_default_quota;
  // --tenant-segment NAME=BYTES: tenant NAME's objects in memory of its own
  // (a memfd only its clients are handed), whole slabs, beside the arena.
  std::map<std::string, std::uint64_t> tenant_segments;
  // --public-tenant NAME: tenants (each with a segment) whose objects every
  // other tenant's clients may read, through the segment handed read-only.
  std::set<std::string> public_tenants;
  // --tenant-uid, --tenant-gid, --admin-group: who each client is.
  TenantBinding binding;
  // --socket-group: the socket is 0660 and this group's (other users'
  // clients connect); none: 0600, the server's user alone.
  std::optional<gid_t> socket_gid;
  // --events ENDPOINT: the tier's KV events on ZeroMQ (off when unset).
  std::optional<EventOptions> events;
  // --check SOCKET: only check whether a server answers there (exit 0/1),
  // trying for check_within.
  std::string check;
  std::chrono::milliseconds check_within{0};
  // --drop-namespace NS: only have the server at --socket drop namespace NS.
  std::string drop_namespace;
  // --drop-tenant NAME: only have the server at --socket drop tenant NAME's namespaces.
  std::string drop_tenant;
};

// The options, or the exit code to leave with (0 after --help; 2 after a
// refusal, which has been printed naming the flag).
std::variant<ServerOptions, int> parse_server_options(int argc, char** argv);

}  // namespace kvstrand::server
