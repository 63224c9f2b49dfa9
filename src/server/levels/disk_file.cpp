#include "server/levels/disk_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>

#include "common/parse_bytes.hpp"
#include "tier/object_header.hpp"
#include "tier/stored_field.hpp"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvstrand::server {

using tier::get_field;
using tier::put_field;

void write_extent_header(const ExtentHeader& x, std::byte* h) {
  std::memcpy(h, kExtentMagic, sizeof kExtentMagic);
  put_field<std::uint32_t>(h + kVersionAt, kExtentVersion);
  put_field<std::uint32_t>(h + kFilesAt, x.files);
  put_field<std::uint64_t>(h + kExtentBytesAt, x.extent_bytes);
  put_field<std::uint64_t>(h + kExtentAt, x.extent);
  put_field<std::uint64_t>(h + kObjectAt, x.object_bytes);
  put_field<std::uint64_t>(h + kStrideAt, x.stride);
  put_field<std::uint64_t>(h + kCheckAt, XXH3_64bits(h, kCheckAt));
}

std::optional<ExtentHeader> read_extent_header(const std::byte* h) {
  if (get_field<std::uint64_t>(h + kCheckAt) != XXH3_64bits(h, kCheckAt) ||
      get_field<std::uint32_t>(h + kVersionAt) != kExtentVersion)
    return std::nullopt;
  return ExtentHeader{get_field<std::uint32_t>(h + kFilesAt), get_field<std::uint64_t>(h + kExtentBytesAt),
                      get_field<std::uint64_t>(h + kExtentAt), get_field<std::uint64_t>(h + kObjectAt),
                      get_field<std::uint64_t>(h + kStrideAt)};
}

Aligned aligned(std::size_t bytes) {
  void* p = std::aligned_alloc(kDiskBlock, round_up(bytes));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, round_up(bytes));
  return Aligned(static_cast<std::byte*>(p));
}

namespace {

// A file kvstrand did not make is never written into (nor extended): a
// symbolic link (its target could be anything), or an existing file that
// holds, at the start of any of its extents, something other than an extent
// header or zeros (what kvstrand preallocated and has not written yet).
// Refused naming --disk; the file is not touched.
void refuse_foreign(const std::string& path, std::uint64_t extent_bytes) {
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0) return;  // absent: made here
  if (S_ISLNK(st.st_mode))
    throw std::runtime_error("--disk: " + path + " is a symbolic link: give the file itself (kvstrand writes only "
                             "into files it can tell are its own)");
  if (!S_ISREG(st.st_mode)) throw std::runtime_error("--disk: " + path + " is not a regular file");
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) throw std::runtime_error("--disk: cannot open " + path + ": " + std::strerror(errno));
  std::array<char, kDiskBlock> head{};
  for (std::uint64_t at = 0; at < static_cast<std::uint64_t>(st.st_size); at += extent_bytes) {
    const ssize_t n = ::pread(fd, head.data(), head.size(), static_cast<off_t>(at));
    if (n <= 0) break;
    const bool zeros = std::all_of(head.begin(), head.begin() + n, [](char c) { return c == 0; });
    if (!zeros && std::memcmp(head.data(), kExtentMagic, std::min<std::size_t>(n, sizeof kExtentMagic)) != 0) {
      ::close(fd);
      throw std::runtime_error("--disk: " + path + " holds data kvstrand did not write (at byte " + std::to_string(at) +
                               ": neither a disk-tier extent header nor unwritten zeros); it is left as it is: give "
                               "a path of its own to the disk tier");
    }
  }
  ::close(fd);
}

}  // namespace

DiskFile open_disk_file(std::string path, std::uint64_t bytes, std::uint64_t extent_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_directory(path, ec)) path = (fs::path(path) / "kvstrand.disk").string();
  refuse_foreign(path, extent_bytes);
  struct stat st{};
  // O_NOFOLLOW: a link put there since the check is refused too (ELOOP).
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0 && errno == EINVAL)
    throw std::runtime_error("--disk: the file system of " + path +
                             " does not take O_DIRECT (tmpfs?): give a file on a disk");
  if (fd < 0) throw std::runtime_error("--disk: cannot open " + path + ": " + std::strerror(errno));
  DiskFile f{path, fd, bytes};
  auto fail = [&](const std::string& why) {
    ::close(fd);
    throw std::runtime_error(why);
  };
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0)
    fail("--disk: " + path + " is used by another kvstrand-server (it holds its lock)");
  if (::fstat(fd, &st) != 0) fail("--disk: " + path + ": " + std::strerror(errno));
  // Preallocated whole, so that a write never finds the file system full.
  const std::uint64_t have = static_cast<std::uint64_t>(st.st_blocks) * 512;
  struct statvfs vfs{};
  if (::fstatvfs(fd, &vfs) == 0 && bytes > have) {
    const std::uint64_t free_bytes = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    if (free_bytes < bytes - have)
      fail("--disk-bytes: the disk tier needs " + common::format_bytes(bytes - have) + " more at " + path +
           " and its file system has " + common::format_bytes(free_bytes) + " free");
  }
  if (static_cast<std::uint64_t>(st.st_size) > bytes && ::ftruncate(fd, static_cast<off_t>(bytes)) != 0)
    fail("--disk: cannot shrink " + path + ": " + std::strerror(errno));
  if (const int e = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)); e != 0)
    fail("--disk-bytes: cannot allocate " + common::format_bytes(bytes) + " at " + path + ": " + std::strerror(e));
  return f;
}

static_assert(kDescriptionAt == tier::kObjectHeaderBytes, "the description follows the object's header");

namespace {
constexpr char kDescriptionMagic[8] = {'K', 'V', 'S', 'T', 'E', 'V', 'T', '\0'};
}  // namespace

bool write_description(std::string_view description, std::byte* block) {
  if (description.empty() || description.size() > kMaxDiskDescription) return false;
  std::byte* d = block + kDescriptionAt;
  std::memcpy(d, kDescriptionMagic, sizeof kDescriptionMagic);
  put_field<std::uint32_t>(d + 8, static_cast<std::uint32_t>(description.size()));
  put_field<std::uint64_t>(d + 16, XXH3_64bits(description.data(), description.size()));
  std::memcpy(d + kDescriptionHeader, description.data(), description.size());
  return true;
}

std::string read_description(const std::byte* block) {
  const std::byte* d = block + kDescriptionAt;
  if (std::memcmp(d, kDescriptionMagic, sizeof kDescriptionMagic) != 0) return {};
  const auto n = get_field<std::uint32_t>(d + 8);
  if (n == 0 || n > kMaxDiskDescription) return {};
  const char* bytes = reinterpret_cast<const char*>(d + kDescriptionHeader);
  if (get_field<std::uint64_t>(d + 16) != XXH3_64bits(bytes, n)) return {};
  return std::string(bytes, n);
}

std::pair<int, std::uint64_t> disk_place(const std::vector<DiskFile>& files, std::uint64_t extent_bytes,
                                         std::uint64_t disk_offset) {
  const std::uint64_t e = disk_offset / extent_bytes;
  const DiskFile& f = files[e % files.size()];
  return {f.fd, (e / files.size()) * extent_bytes + disk_offset % extent_bytes};
}

}  // namespace kvstrand::server
