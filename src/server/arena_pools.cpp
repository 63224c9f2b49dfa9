#include "server/arena_pools.hpp"

#include <spdlog/spdlog.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/parse_bytes.hpp"

namespace kvstrand::server {

ArenaPools::ArenaPools(tier::Arena& arena, const std::map<std::string, std::uint64_t>& segments,
                       const std::set<std::string>& published, bool huge_pages)
    : arena_(arena) {
  // Options refused a segment with a named arena: a segment is a memfd.
  for (const auto& [name, bytes] : segments) {
    try {
      segments_.push_back(
          std::make_unique<tier::Arena>(tier::ArenaOptions{bytes, arena.slab_bytes(), huge_pages, {}}));
    } catch (const std::runtime_error& e) {
      throw std::runtime_error("--tenant-segment: cannot create tenant '" + name + "''s segment: " + e.what());
    }
    pool_of_[name] = segments_.size();
    spdlog::info("kvstrand-server: tenant '{}' has a segment of its own ({})", name, common::format_bytes(bytes));
  }
  for (const std::string& name : published) {
    const int fd = segments_.at(pool_of_.at(name) - 1)->fd();
    const std::string self = "/proc/self/fd/" + std::to_string(fd);
    // The mode first: the read-only descriptor's file is the segment itself.
    const int ro = ::fchmod(fd, 0600) == 0 ? ::open(self.c_str(), O_RDONLY | O_CLOEXEC) : -1;
    if (ro < 0) {
      const int e = errno;
      for (const auto& [_, opened] : read_only_fds_) ::close(opened);
      throw std::runtime_error("--public-tenant: cannot open tenant '" + name + "''s segment read-only: " +
                               std::strerror(e));
    }
    read_only_fds_[name] = ro;
    spdlog::info("kvstrand-server: tenant '{}' publishes: every tenant's clients may read its segment", name);
  }
}

ArenaPools::~ArenaPools() {
  unmap();
  for (const auto& [_, fd] : read_only_fds_) ::close(fd);
}

int ArenaPools::read_only_fd(const std::string& tenant) const {
  auto it = read_only_fds_.find(tenant);
  return it == read_only_fds_.end() ? -1 : it->second;
}

std::size_t ArenaPools::pool_of(const std::string& tenant) const {
  auto it = pool_of_.find(tenant);
  return it == pool_of_.end() ? 0 : it->second;
}

std::map<std::string, std::size_t> ArenaPools::published() const {
  std::map<std::string, std::size_t> out;
  for (const auto& [name, _] : read_only_fds_) out[name] = pool_of(name);
  return out;
}

std::uint32_t ArenaPools::slab_count() const noexcept {
  std::uint32_t n = arena_.slab_count();
  for (const auto& s : segments_) n += s->slab_count();
  return n;
}

std::uint64_t ArenaPools::segment_bytes() const noexcept {
  std::uint64_t n = 0;
  for (const auto& s : segments_) n += s->bytes();
  return n;
}

std::uint64_t ArenaPools::base(std::size_t p) const {
  std::uint64_t at = 0;
  for (std::size_t q = 0; q < p; ++q) at += pool(q).bytes();
  return at;
}

std::vector<std::uint32_t> ArenaPools::ends() const {
  std::vector<std::uint32_t> out;
  for (std::size_t p = 0; p < pools(); ++p)
    out.push_back(static_cast<std::uint32_t>((base(p) + pool(p).bytes()) / arena_.slab_bytes()));
  return out;
}

std::string ArenaPools::populate(std::uint32_t slab) const {
  std::uint32_t first = 0;
  for (std::size_t p = 0; p < pools(); ++p) {
    if (slab < first + pool(p).slab_count()) return pool(p).populate(slab - first);
    first += pool(p).slab_count();
  }
  return "slab " + std::to_string(slab) + " is in no pool";
}

std::byte* ArenaPools::map(const char* flag) {
  unmap();
  // Aligned for huge pages, which map only at 2 MiB boundaries.
  constexpr std::size_t k2M = 2u << 20;
  const std::size_t total = arena_.bytes() + segment_bytes();
  void* r = ::mmap(nullptr, total + k2M, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (r == MAP_FAILED) throw std::runtime_error(std::string(flag) + ": cannot map the arena: " + std::strerror(errno));
  reserved_ = {r, total + k2M};
  auto* at = reinterpret_cast<std::byte*>((reinterpret_cast<std::uintptr_t>(r) + k2M - 1) / k2M * k2M);
  for (std::size_t p = 0; p < pools(); ++p) {
    const tier::Arena& a = pool(p);
    if (::mmap(at + base(p), a.bytes(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, a.fd(), 0) == MAP_FAILED) {
      const int e = errno;
      unmap();
      throw std::runtime_error(std::string(flag) + ": cannot map the arena: " + std::strerror(e));
    }
  }
  mapped_ = at;
  return mapped_;
}

void ArenaPools::unmap() {
  if (reserved_.first) ::munmap(reserved_.first, reserved_.second);
  reserved_ = {nullptr, 0};
  mapped_ = nullptr;
}

}  // namespace kvstrand::server
