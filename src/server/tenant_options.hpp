// The tenants' own flags of kvstrand-server (--tenant-quota, --tenant-segment,
// --public-tenant, --tenant-quota-default), checked together: each depends
// on the binding of tenants to users (--tenant-uid, --tenant-gid) and on the
// arena's size, read before them.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "server/server_options.hpp"

namespace kvstrand::server {

// As given on the command line or in a config file.
struct TenantFlags {
  std::vector<std::string> quotas;    // NAME=BYTES
  std::vector<std::string> segments;  // NAME=BYTES
  std::vector<std::string> publics;   // NAME
  std::string default_quota;
};

// Into `o` (whose binding, tier and slab sizes, arena path and max_tenants
// are set); the first refusal otherwise, as {flag, why}.
std::optional<std::pair<std::string, std::string>> take_tenant_flags(const TenantFlags& given, ServerOptions& o);

}  // namespace kvstrand::server
