// Who a client is, from the kernel (SO_PEERCRED, SO_PEERGROUPS), never from
// what it says. The operator maps users and groups to tenants
// (--tenant-uid, --tenant-gid, a config file's [tenants.NAME] tables): a
// process so mapped registers only as its tenant. The server's own user,
// root and --admin-group are admins: they may drop any namespace or tenant,
// and (unless mapped themselves) register as any tenant. Anyone else is
// refused at connect.
//
// With no map, every client is the server's user (the socket is 0600), an
// unbound admin: tenants are then names the clients choose, accounting and
// not isolation.
#pragma once

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/expected.hpp"

namespace kvstrand::server {

// The operator's map of users and groups to tenants, and the admins' group.
struct TenantBinding {
  std::map<uid_t, std::string> uids;  // --tenant-uid NAME=USER
  std::map<gid_t, std::string> gids;  // --tenant-gid NAME=GROUP
  std::optional<gid_t> admin_gid;     // --admin-group
  bool maps_tenants() const noexcept { return !uids.empty() || !gids.empty(); }
};

// A connected process's credentials as the kernel gave them at connect.
struct PeerCredentials {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  std::vector<gid_t> groups;  // supplementary, the primary gid not always among them
};

// What the server lets a peer do.
struct Peer {
  uid_t uid = 0;
  bool admin = false;  // drops any namespace or tenant
  // The tenant its credentials map to: its registrations are this tenant's
  // only. Empty: none (an admin not in the map), any tenant it names.
  std::string tenant;
};

// The credentials of the process at the other end of the local socket `fd`.
common::Expected<PeerCredentials> peer_credentials(int fd);

// What `peer` may do on a server running as `server_uid`, or why it is
// refused its connection (naming the options that would let it in).
common::Expected<Peer> identify(const PeerCredentials& peer, const TenantBinding& binding, uid_t server_uid);

}  // namespace kvstrand::server
