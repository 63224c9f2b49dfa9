#include "server/tenant_options.hpp"

#include <algorithm>
#include <cstdint>

#include "common/parse_bytes.hpp"
#include "tier/arena.hpp"
#include "tier/size_classes.hpp"
#include <kvstrand/layout.hpp>

namespace kvstrand::server {

std::optional<std::pair<std::string, std::string>> take_tenant_flags(const TenantFlags& given, ServerOptions& o) {
  const auto refused = [](const std::string& flag, const std::string& why) {
    return std::optional<std::pair<std::string, std::string>>({flag, why});
  };
  std::uint64_t reserved_total = 0;
  for (const std::string& t : given.quotas) {
    const auto eq = t.find('=');
    const std::string name = eq == std::string::npos ? "" : t.substr(0, eq);
    auto q = eq == std::string::npos ? std::nullopt : common::parse_bytes(t.substr(eq + 1));
    if (name.empty() || !q || *q == 0) return refused("--tenant-quota", "'" + t + "' is not NAME=BYTES, e.g. team-a=40G");
    if (auto why = kv::tenant_problem(name)) return refused("--tenant-quota", *why);
    if (!o.tenant_quotas.emplace(name, *q).second) return refused("--tenant-quota", "tenant '" + name + "' is given twice");
    reserved_total += *q;
  }
  // Each named tenant has its id from the start, beside the unnamed one.
  if (o.tenant_quotas.size() + 1 > o.max_tenants)
    return refused("--max-tenants", std::to_string(o.max_tenants) + " is fewer than the " +
                                       std::to_string(o.tenant_quotas.size()) +
                                       " tenants --tenant-quota names and the unnamed one");
  // Each quota is also a reserve no other tenant evicts: more than the arena
  // could not be kept.
  if (reserved_total > o.tier_bytes)
    return refused("--tenant-quota", "the quotas add up to " + common::format_bytes(reserved_total) +
                                        ", more than --tier-bytes (" + common::format_bytes(o.tier_bytes) + ")");
  std::uint64_t segments_total = 0;
  for (const std::string& t : given.segments) {
    const auto eq = t.find('=');
    const std::string name = eq == std::string::npos ? "" : t.substr(0, eq);
    auto q = eq == std::string::npos ? std::nullopt : common::parse_bytes(t.substr(eq + 1));
    if (name.empty() || !q || *q == 0)
      return refused("--tenant-segment", "'" + t + "' is not NAME=BYTES, e.g. team-a=40G");
    if (auto why = kv::tenant_problem(name)) return refused("--tenant-segment", *why);
    // Only the kernel's word hands a client a segment: a self-declared
    // tenant would let anyone name it.
    const auto bound = [&](const auto& map) {
      return std::any_of(map.begin(), map.end(), [&](const auto& kv) { return kv.second == name; });
    };
    if (!bound(o.binding.uids) && !bound(o.binding.gids))
      return refused("--tenant-segment", "tenant '" + name + "' is bound to no user: give --tenant-uid " + name +
                                            "=USER or --tenant-gid " + name +
                                            "=GROUP (a segment is handed to the clients the kernel says are its)");
    const std::uint64_t whole = (*q + o.slab_bytes - 1) / o.slab_bytes * o.slab_bytes;
    if (!o.tenant_segments.emplace(name, whole).second)
      return refused("--tenant-segment", "tenant '" + name + "' is given twice");
    segments_total += whole;
  }
  if (!o.tenant_segments.empty()) {
    if (!o.arena_path.empty())
      return refused("--tenant-segment", "is not kept across restarts: a named arena (--arena-path) is one file; "
                                        "use one or the other");
    if (o.tenant_segments.size() + 1 > tier::SizeClasses::kMaxClasses)
      return refused("--tenant-segment", "more segments than the " + std::to_string(tier::SizeClasses::kMaxClasses) +
                                            " size classes the server can keep");
    if (const std::uint64_t avail = tier::available_memory_bytes();
        avail != 0 && o.tier_bytes + segments_total > avail)
      return refused("--tenant-segment", "the segments (" + common::format_bytes(segments_total) +
                                            ") and --tier-bytes are more than this machine can hold now (" +
                                            std::to_string(avail >> 20) + " MiB available)");
  }
  if (!given.default_quota.empty()) {
    auto q = common::parse_bytes(given.default_quota);
    if (!q || *q == 0 || *q > o.tier_bytes)
      return refused("--tenant-quota-default", "'" + given.default_quota + "' is not a size from 1 byte to --tier-bytes");
    o.tenant_default_quota = *q;
  }
  // A published tenant's objects are read through its segment, handed
  // read-only: in the arena, which every client maps read-write, a reader
  // could overwrite them.
  for (const std::string& name : given.publics) {
    if (auto why = kv::tenant_problem(name)) return refused("--public-tenant", *why);
    if (!o.tenant_segments.contains(name))
      return refused("--public-tenant", "tenant '" + name + "' has no --tenant-segment: what it publishes must be "
                                        "memory of its own, which its readers are handed read-only");
    if (!o.public_tenants.insert(name).second) return refused("--public-tenant", "tenant '" + name + "' is given twice");
  }
  return std::nullopt;
}

}  // namespace kvstrand::server
