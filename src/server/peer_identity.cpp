#include "server/peer_identity.hpp"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

namespace kvstrand::server {

common::Expected<PeerCredentials> peer_credentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return common::unexpected(std::string("SO_PEERCRED: ") + std::strerror(errno));
  PeerCredentials out{cred.pid, cred.uid, cred.gid, {}};
  // NGROUPS_MAX is 65536: asked once for the size, then read.
  socklen_t bytes = 0;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, nullptr, &bytes) != 0 && errno != ERANGE)
    return common::unexpected(std::string("SO_PEERGROUPS: ") + std::strerror(errno));
  out.groups.resize(bytes / sizeof(gid_t));
  if (bytes != 0 && ::getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, out.groups.data(), &bytes) != 0)
    return common::unexpected(std::string("SO_PEERGROUPS: ") + std::strerror(errno));
  out.groups.resize(bytes / sizeof(gid_t));
  return out;
}

common::Expected<Peer> identify(const PeerCredentials& p, const TenantBinding& b, uid_t server_uid) {
  std::vector<gid_t> groups = p.groups;
  groups.push_back(p.gid);
  const auto in = [&](gid_t g) { return std::find(groups.begin(), groups.end(), g) != groups.end(); };
  Peer out;
  out.uid = p.uid;
  out.admin = p.uid == server_uid || p.uid == 0 || (b.admin_gid && in(*b.admin_gid));
  if (auto it = b.uids.find(p.uid); it != b.uids.end()) {
    out.tenant = it->second;  // a user's own mapping wins over its groups'
  } else {
    std::set<std::string> by_group;
    for (gid_t g : groups)
      if (auto gt = b.gids.find(g); gt != b.gids.end()) by_group.insert(gt->second);
    if (by_group.size() > 1)
      return common::unexpected("uid " + std::to_string(p.uid) + " is in the groups of tenants '" + *by_group.begin() +
                                "' and '" + *std::next(by_group.begin()) +
                                "' (--tenant-gid): map the user itself with --tenant-uid");
    if (by_group.size() == 1) out.tenant = *by_group.begin();
  }
  if (!out.admin && out.tenant.empty())
    return common::unexpected("uid " + std::to_string(p.uid) + " is not the server's (uid " + std::to_string(server_uid) +
                              "), root, a tenant's (--tenant-uid, --tenant-gid) or in --admin-group");
  return out;
}

}  // namespace kvstrand::server
