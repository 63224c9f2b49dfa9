// The disk tier's restart at scale (issue 66): a disk file holding N
// objects, written as kvstrand-server's disk tier lays it out (each extent's
// header, each slot's header block before its object), then read back as a
// restarted server does (server::recover_disk, through io_uring, O_DIRECT),
// at 10k, 100k and 1M objects of 4 KiB (--max 10000000 adds 10M: a sparse
// file of 80 GiB, 40 GiB of it header blocks written). Per size: the
// restart's seconds and objects/s, and every object then looked up in the
// disk's index by its key. The last line: the largest restart against the
// goal (1M objects within 5 s).
//
// The file lives in --dir (default: the current directory's build/), the
// disk the server would use there; it is removed after each size.
//
// usage: bench_disk_recovery [--max N] [--dir DIR]
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "common/strand.hpp"
#include "server/levels/disk_file.hpp"
#include "server/levels/disk_recovery.hpp"
#include "server/levels/disk_ring.hpp"
#include "tier/object_header.hpp"
#include "tier/size_classes.hpp"
#include "numbered_key.hpp"

using namespace kvstrand;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint64_t kObject = 4096;
constexpr std::uint64_t kExtent = 64ull << 20;

kv::ChunkKey key(std::uint64_t i) { return bench::numbered_key(i); }

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "bench_disk_recovery: %s\n", why.c_str());
  std::exit(1);
}

struct Figures {
  double seconds = 0;
  std::uint64_t recovered = 0;
};

const tier::SlotShape kDiskShape{server::kDiskBlock, server::kDiskBlock, server::kDiskBlock};

Figures measure(std::uint64_t n, const std::filesystem::path& dir) {
  const tier::SizeClasses shape(kExtent, nullptr, kDiskShape);
  const tier::SlabGeometry g = shape.geometry(kObject);
  const auto extents = static_cast<std::uint32_t>((n + g.per_slab - 1) / g.per_slab);
  const std::filesystem::path file = dir / "kvstrand.disk";
  std::filesystem::remove(file);
  {
    // Written as the server's disk tier writes it, an extent at a time
    // through the page cache (the objects' own blocks left zero: a restart
    // reads only the headers), then flushed.
    server::DiskFile made = server::open_disk_file(dir.string(), std::uint64_t{extents} * kExtent, kExtent);
    ::close(made.fd);
    const int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) die("cannot open " + file.string());
    std::vector<std::byte> extent(kExtent);
    std::vector<std::byte> object(kObject);
    std::uint64_t i = 0;
    for (std::uint32_t e = 0; e < extents; ++e) {
      std::memset(extent.data(), 0, extent.size());
      server::write_extent_header({1, kExtent, e, kObject, g.stride}, extent.data());
      for (std::uint32_t k = 0; k < g.per_slab && i < n; ++k, ++i)
        tier::write_object_header(key(i), false, object, extent.data() + g.first_object + k * g.stride);
      if (::pwrite(fd, extent.data(), kExtent, static_cast<off_t>(std::uint64_t{e} * kExtent)) !=
          static_cast<ssize_t>(kExtent))
        die("cannot write " + file.string());
    }
    if (::fsync(fd) != 0) die("cannot fsync " + file.string());
    ::close(fd);
  }
  // The restart: the file opened as the server opens it, every header read.
  boost::asio::io_context io;
  common::Strand strand(io.get_executor());
  std::vector<server::DiskFile> files{server::open_disk_file(dir.string(), std::uint64_t{extents} * kExtent, kExtent)};
  auto ring = server::DiskRing::open(strand, 64, 1, server::DiskFault{});
  if (!ring) die("io_uring: " + ring.why());
  tier::SizeClasses disk(kExtent, nullptr, kDiskShape);
  disk.set_slab_count(extents);
  const auto t0 = Clock::now();
  const server::DiskRecovery r = server::recover_disk(**ring, files, kExtent, extents, disk);
  Figures f;
  f.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  f.recovered = r.objects;
  const tier::Index* idx = disk.index(kObject);
  std::uint64_t found = 0;
  for (std::uint64_t j = 0; idx && j < n; ++j) found += idx->present(key(j));
  if (r.objects != n || found != n)
    die(std::to_string(r.objects) + " objects recovered, " + std::to_string(found) + " of " + std::to_string(n) +
        " found by key");
  ::close(files[0].fd);
  std::filesystem::remove(file);
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t max = 1'000'000;
  std::filesystem::path dir = "build";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--max") max = std::max<std::uint64_t>(10'000, std::stoull(argv[i + 1]));
    else if (a == "--dir") dir = argv[i + 1];
    else die("usage: bench_disk_recovery [--max N] [--dir DIR]");
  }
  std::filesystem::create_directories(dir);
  std::printf("bench_disk_recovery: objects of %llu B in extents of %llu MiB, in %s\n",
              static_cast<unsigned long long>(kObject), static_cast<unsigned long long>(kExtent >> 20), dir.c_str());
  Figures last;
  std::uint64_t last_n = 0;
  for (std::uint64_t n = 10'000; n <= max; n *= 10) {
    last = measure(n, dir);
    last_n = n;
    std::printf("  %9llu objects: restart %7.3f s (%9.0f objects/s), every object found by its key\n",
                static_cast<unsigned long long>(n), last.seconds, static_cast<double>(n) / last.seconds);
    std::fflush(stdout);
  }
  std::printf("disk restart of %llu objects: %.2f s (goal for 1M: 5 s)\n", static_cast<unsigned long long>(last_n),
              last.seconds);
  return 0;
}
