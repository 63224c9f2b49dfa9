// Who a client is: the kernel's credentials of the connecting process, and
// what the operator's tenant map (--tenant-uid, --tenant-gid,
// --admin-group) lets it do.
#include <grp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>

#include <catch2/catch.hpp>

#include "server/peer_identity.hpp"

using namespace kvstrand::server;

TEST_CASE("peer identity: the kernel's credentials of the other end of a local socket", "[server][trust]") {
  int fds[2];
  REQUIRE(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  const auto cred = peer_credentials(fds[0]);
  ::close(fds[0]);
  ::close(fds[1]);
  REQUIRE(cred.has_value());
  REQUIRE(cred->pid == ::getpid());
  REQUIRE(cred->uid == ::geteuid());
  REQUIRE(cred->gid == ::getegid());
  std::vector<gid_t> mine(static_cast<std::size_t>(::getgroups(0, nullptr)));
  mine.resize(static_cast<std::size_t>(::getgroups(static_cast<int>(mine.size()), mine.data())));
  REQUIRE(cred->groups.size() == mine.size());
}

TEST_CASE("peer identity: a peer's supplementary groups are read whole, each one", "[server][trust]") {
  if (::geteuid() != 0) {
    WARN("skipped: choosing this process's groups needs root");
    return;
  }
  // In a child (the groups are the process's): two groups of its own, then
  // the credentials of its end of a socket pair. A group list read into a
  // buffer never sized for it lost every group.
  const pid_t child = ::fork();
  if (child == 0) {
    const gid_t groups[] = {61010, 61011};
    int fds[2];
    if (::setgroups(2, groups) != 0 || ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) ::_exit(2);
    const auto cred = peer_credentials(fds[0]);
    std::vector<gid_t> got = cred ? cred->groups : std::vector<gid_t>{};
    std::sort(got.begin(), got.end());
    ::_exit(got == std::vector<gid_t>{61010, 61011} ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}

TEST_CASE("peer identity: with no map, the server's user and root are admins of no tenant, anyone else refused",
          "[server][trust]") {
  const TenantBinding none;
  for (uid_t u : {1000u, 0u}) {
    const auto p = identify(PeerCredentials{1, u, 100, {}}, none, 1000);
    REQUIRE(p.has_value());
    REQUIRE(p->admin);
    REQUIRE(p->tenant.empty());
  }
  const auto other = identify(PeerCredentials{1, 1001, 100, {}}, none, 1000);
  REQUIRE_FALSE(other.has_value());
  REQUIRE(other.why().find("--tenant-uid") != std::string::npos);
}

TEST_CASE("peer identity: a mapped user is its tenant, its own mapping wins over its groups', two groups' tenants "
          "are refused",
          "[server][trust]") {
  TenantBinding b;
  b.uids = {{2001, "team-a"}};
  b.gids = {{3001, "team-b"}, {3002, "team-c"}};
  b.admin_gid = 3999;
  const auto a = identify(PeerCredentials{1, 2001, 3001, {3002}}, b, 1000);
  REQUIRE(a.has_value());
  REQUIRE(a->tenant == "team-a");
  REQUIRE_FALSE(a->admin);
  // By its primary group, or a supplementary one.
  REQUIRE(identify(PeerCredentials{1, 2002, 3001, {}}, b, 1000)->tenant == "team-b");
  REQUIRE(identify(PeerCredentials{1, 2002, 100, {3002}}, b, 1000)->tenant == "team-c");
  const auto both = identify(PeerCredentials{1, 2002, 3001, {3002}}, b, 1000);
  REQUIRE_FALSE(both.has_value());
  REQUIRE(both.why().find("team-b") != std::string::npos);
  REQUIRE(both.why().find("team-c") != std::string::npos);
  // The admins' group: an admin, bound to no tenant unless mapped too.
  const auto admin = identify(PeerCredentials{1, 2003, 100, {3999}}, b, 1000);
  REQUIRE(admin.has_value());
  REQUIRE(admin->admin);
  REQUIRE(admin->tenant.empty());
  const auto mapped_admin = identify(PeerCredentials{1, 2001, 100, {3999}}, b, 1000);
  REQUIRE(mapped_admin->admin);
  REQUIRE(mapped_admin->tenant == "team-a");
  REQUIRE_FALSE(identify(PeerCredentials{1, 2004, 100, {4000}}, b, 1000).has_value());
}
