#include "tier/tenant_book.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvstrand::tier {

TenantBook::TenantBook(std::map<std::string, std::uint64_t> quotas, std::uint64_t default_quota,
                       std::size_t max_tenants)
    : quotas_(std::move(quotas)),
      default_quota_(default_quota),
      max_tenants_(std::clamp<std::size_t>(std::max(max_tenants, quotas_.size() + 1), 1, kMaxTenants)) {
  id_of("");
  for (const auto& [name, q] : quotas_) id_of(name);
}

std::optional<TenantId> TenantBook::id_of(const std::string& name) {
  if (auto it = ids_.find(name); it != ids_.end()) return it->second;
  const std::uint64_t tag = tag_of(name);
  if (auto it = by_tag_.find(tag); it != by_tag_.end() && tenants_[it->second].name.starts_with('#')) {
    // Found again at a restart before it registered: its objects are its own.
    const TenantId id = it->second;
    ids_.erase(tenants_[id].name);
    tenants_[id].name = name;
    auto q = quotas_.find(name);
    tenants_[id].quota = q != quotas_.end() ? q->second : default_quota_;
    ids_.emplace(name, id);
    return id;
  }
  if (tenants_.size() >= max_tenants_) return std::nullopt;
  const auto id = static_cast<TenantId>(tenants_.size());
  auto q = quotas_.find(name);
  tenants_.push_back(Tenant{name, q != quotas_.end() ? q->second : default_quota_, 0, 0});
  ids_.emplace(name, id);
  by_tag_.emplace(tag, id);
  return id;
}

std::uint64_t TenantBook::tag_of(const std::string& name) {
  if (name.empty()) return 0;
  const std::uint64_t t = XXH3_64bits(name.data(), name.size());
  return t == 0 ? 1 : t;
}

std::optional<TenantId> TenantBook::id_of_tag(std::uint64_t tag) {
  if (auto it = by_tag_.find(tag); it != by_tag_.end()) return it->second;
  if (tenants_.size() >= max_tenants_) return std::nullopt;
  char hex[20];
  std::snprintf(hex, sizeof hex, "#%016llx", static_cast<unsigned long long>(tag));
  const auto id = static_cast<TenantId>(tenants_.size());
  tenants_.push_back(Tenant{hex, default_quota_, 0, 0});
  ids_.emplace(hex, id);
  by_tag_.emplace(tag, id);
  return id;
}

std::optional<TenantId> TenantBook::find(const std::string& name) const {
  auto it = ids_.find(name);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

bool TenantBook::would_pass(TenantId t, std::uint64_t bytes) const {
  const Tenant& x = tenants_.at(t);
  return x.quota != kNoQuota && x.used + bytes > x.quota;
}

bool TenantBook::can_spare(TenantId t, std::uint64_t bytes) const {
  const Tenant& x = tenants_.at(t);
  return x.quota == kNoQuota || (x.used >= bytes && x.used - bytes >= x.quota);
}

TenantBook TenantBook::scaled(double factor) const {
  const auto scale = [&](std::uint64_t q) {
    return q == kNoQuota ? kNoQuota : static_cast<std::uint64_t>(std::floor(static_cast<double>(q) * factor));
  };
  std::map<std::string, std::uint64_t> quotas;
  for (const auto& [name, q] : quotas_) quotas[name] = scale(q);
  return TenantBook(std::move(quotas), scale(default_quota_), max_tenants_);
}

}  // namespace kvstrand::tier
