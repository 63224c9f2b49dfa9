// Tenants' shares of a tier (kvstrand-server --tenant-quota): every object
// belongs to a tenant (its registration's Layout::tenant; "" for none), and
// the bytes each holds are counted here, over every object size.
//
// A tenant given a quota may hold that much, and no other tenant's reserve
// is taken from it: a reserve for tenant T may evict
// - T's own objects, and
// - another tenant's whose bytes stay at or above its quota without it (a
//   tenant with no quota has no reserve);
// and once T would pass its own quota, T's own objects first. With no
// quotas that is every object, as before tenants.
//
// Shared by the indexes of one tier (the arena's classes, or the disk's),
// on the owner's strand.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kvstrand::tier {

using TenantId = std::uint16_t;

class TenantBook {
 public:
  static constexpr std::uint64_t kNoQuota = UINT64_MAX;
  // The most tenants a book can tell apart (TenantId's range): the server's
  // --max-tenants is at most this.
  static constexpr std::size_t kMaxTenants = UINT16_MAX;
  struct Tenant {
    std::string name;
    std::uint64_t quota = kNoQuota;
    std::uint64_t used = 0;
    std::uint64_t evicted = 0;
  };
  // `quotas` by name; `default_quota` for every other tenant (kNoQuota: none).
  // Every tenant `quotas` names has its id from the start, so a configured
  // tenant keeps its quota however many others came first. At most
  // `max_tenants` (and kMaxTenants), the unnamed one and those of `quotas`
  // included.
  explicit TenantBook(std::map<std::string, std::uint64_t> quotas = {}, std::uint64_t default_quota = kNoQuota,
                      std::size_t max_tenants = kMaxTenants);

  // The tenant's id, made on first use ("" is 0); nothing once the book
  // holds max_tenants() and `name` is not among them.
  std::optional<TenantId> id_of(const std::string& name);
  // The tenant's id if it has one here, without making one.
  std::optional<TenantId> find(const std::string& name) const;
  // What an object kept across a restart records of its tenant (the named
  // arena's object table, the disk's header): a hash of its name, 0 for
  // the unnamed one. The name is not kept: it may be a secret's neighbour.
  static std::uint64_t tag_of(const std::string& name);
  std::uint64_t tag(TenantId t) const { return tag_of(tenants_.at(t).name); }
  // The tenant an object found again at a restart belongs to: the one whose
  // name has this tag, or else one kept under the tag alone ("#" and its
  // hex: no tenant name has a '#'), whose bytes, evictions and quota become
  // the named tenant's the moment it registers (id_of). Nothing past
  // max_tenants().
  std::optional<TenantId> id_of_tag(std::uint64_t tag);
  std::size_t size() const noexcept { return tenants_.size(); }
  std::size_t max_tenants() const noexcept { return max_tenants_; }
  // Every tenant, by id (iterate this: a TenantId counter cannot count to
  // size() when size() is past its range).
  const std::vector<Tenant>& all() const noexcept { return tenants_; }
  const std::string& name(TenantId t) const { return tenants_.at(t).name; }
  std::uint64_t quota(TenantId t) const { return tenants_.at(t).quota; }
  std::uint64_t used(TenantId t) const { return tenants_.at(t).used; }
  std::uint64_t evicted(TenantId t) const { return tenants_.at(t).evicted; }

  // Whether tenant t would pass its quota by `bytes` more.
  bool would_pass(TenantId t, std::uint64_t bytes) const;
  // Whether t keeps its quota without `bytes` of its own (true without one).
  bool can_spare(TenantId t, std::uint64_t bytes) const;

  void charge(TenantId t, std::uint64_t bytes) { tenants_.at(t).used += bytes; }
  void credit(TenantId t, std::uint64_t bytes) { tenants_.at(t).used -= bytes; }
  void count_eviction(TenantId t) { ++tenants_.at(t).evicted; }

  // The same quotas, each times `factor` (the disk's shares of its size).
  TenantBook scaled(double factor) const;

 private:
  std::map<std::string, std::uint64_t> quotas_;
  std::uint64_t default_quota_;
  std::size_t max_tenants_;
  std::vector<Tenant> tenants_;
  std::map<std::string, TenantId> ids_;
  std::map<std::uint64_t, TenantId> by_tag_;  // every tenant by its tag (one found again by tag only: "#" + hex)
};

}  // namespace kvstrand::tier
