// A named arena (kvstrand-server --arena-path) of a test's own on tmpfs,
// removed when the test ends.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <string>

namespace kvstrand::test {

struct ArenaFile {
  std::string path = "/dev/shm/kvstrand-test-arena-" + std::to_string(::getpid()) + "-" + std::to_string(next()++);
  ArenaFile() = default;
  ArenaFile(const ArenaFile&) = delete;
  ArenaFile& operator=(const ArenaFile&) = delete;
  ~ArenaFile() {
    ::unlink(path.c_str());
    ::unlink((path + ".lock").c_str());
  }
  static int& next() {
    static int n = 0;
    return n;
  }
  // Overwrites `n` bytes at `offset` of the file (what a bad write or a
  // later format would leave), the server being stopped.
  void patch(std::uint64_t offset, const void* bytes, std::size_t n) const {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::pwrite(fd, bytes, n, static_cast<off_t>(offset)) == static_cast<ssize_t>(n));
    ::close(fd);
  }
};

}  // namespace kvstrand::test
