// A file of the disk tier, and the header that opens each of its extents.
//
// A file is made if absent, preallocated whole (a write never finds the file
// system full), locked against a second server, and opened O_DIRECT. A file
// kvstrand did not make is never written into (nor extended): a symbolic
// link, or an existing file that holds, at the start of any of its extents,
// something other than an extent header or zeros. Every refusal names the
// flag at fault (--disk, --disk-bytes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvstrand::server {

inline constexpr std::uint64_t kDiskBlock = 4096;  // O_DIRECT's alignment, and a header block

// The extent header (the first block of an extent). Its checksum covers [0, kCheckAt).
inline constexpr char kExtentMagic[8] = {'K', 'V', 'S', 'D', 'I', 'S', 'K', '\0'};
inline constexpr std::uint32_t kExtentVersion = 1;
inline constexpr std::size_t kVersionAt = 8, kFilesAt = 12, kExtentBytesAt = 16, kExtentAt = 24, kObjectAt = 32,
                             kStrideAt = 40, kCheckAt = 56;

// What an extent header records: the geometry its extent was written in.
struct ExtentHeader {
  std::uint32_t files = 0;
  std::uint64_t extent_bytes = 0, extent = 0, object_bytes = 0, stride = 0;
};
// Writes `h` into `block` (kDiskBlock bytes, zeroed).
void write_extent_header(const ExtentHeader& h, std::byte* block);
// The header in `block`, which starts with kExtentMagic; nothing when its
// checksum or version does not match (a torn or foreign header).
std::optional<ExtentHeader> read_extent_header(const std::byte* block);

// A slot's header block holds, after the object's header
// (tier::kObjectHeaderBytes), the object's KV-event description when there
// is one and it fits: "KVSTEVT\0", its length (u32), 4 zero bytes, XXH3-64
// of it, then its bytes. A restarted server announces the object with it.
inline constexpr std::size_t kDescriptionAt = 128, kDescriptionHeader = 24;
inline constexpr std::size_t kMaxDiskDescription = kDiskBlock - kDescriptionAt - kDescriptionHeader;
// Into `block` (zeroed after the object header); false: too long to keep.
bool write_description(std::string_view description, std::byte* block);
// The description `block` holds whole; empty when none (or torn).
std::string read_description(const std::byte* block);

// kDiskBlock-aligned, zeroed memory for O_DIRECT, in whole blocks.
inline std::uint64_t round_up(std::uint64_t n) { return (n + kDiskBlock - 1) / kDiskBlock * kDiskBlock; }
struct AlignedFree {
  void operator()(std::byte* p) const { std::free(p); }
};
using Aligned = std::unique_ptr<std::byte[], AlignedFree>;
Aligned aligned(std::size_t bytes);

struct DiskFile {
  std::string path;
  int fd = -1;
  std::uint64_t bytes = 0;
};

// Where disk offset `disk_offset` lies: extents are dealt to the files in
// turn (extent e in file e % files, at its (e / files)-th extent).
std::pair<int, std::uint64_t> disk_place(const std::vector<DiskFile>& files, std::uint64_t extent_bytes,
                                         std::uint64_t disk_offset);

// Opens `path` (a directory: kvstrand.disk in it) as a file of `bytes` in
// extents of `extent_bytes`; throws std::runtime_error saying why not.
DiskFile open_disk_file(std::string path, std::uint64_t bytes, std::uint64_t extent_bytes);

}  // namespace kvstrand::server
