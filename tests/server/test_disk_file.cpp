// kvstrand-server's disk-tier files (src/server/levels/disk_file): striped over
// several, found again by a restarted server in each; a second server on the
// same file, bad --disk flags, a symbolic link or a file kvstrand did not
// make are refused naming the flag, and the file is left as it is.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "disk_node.hpp"
#include "tier/object_header.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;

TEST_CASE("disk: striped over two files, each holds objects, and a restart finds them in both", "[disk][server]") {
  DiskDir a, b;
  auto flags = [&](std::uint16_t port) {
    std::vector<std::string> f = kFlags;
    for (const std::string& x : {std::string("--disk"), a.path, std::string("--disk"), b.path,
                                 std::string("--disk-bytes"), std::string("64M"), std::string("--http"),
                                 "127.0.0.1:" + std::to_string(port)})
      f.push_back(x);
    return f;
  };
  const std::uint16_t port = free_port();
  auto headers_in = [](const std::string& file) {
    const int fd = ::open(file.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    std::vector<std::byte> block(4096);
    int n = 0;
    for (off_t off = 0; ::pread(fd, block.data(), block.size(), off) == 4096; off += 4096)
      n += tier::read_object_header(block).has_value() ? 1 : 0;
    ::close(fd);
    return n;
  };
  {
    ServerProcess srv(flags(port));
    REQUIRE(srv.ready());
    REQUIRE(Client(srv.socket_path()).wait_full());
    Client c(srv.socket_path());
    int fd = -1;
    REQUIRE(c.hello(&fd)->status == Status::ok);
    Mapped arena(fd, 16u << 20);
    const std::uint32_t reg = std::get<RegisterReply>(must_call(c, RegisterLayout{layout()}).payload).registration;
    // 400 objects: more than one extent (170 slots) of the first file.
    for (int p = 1; p <= 8; ++p) {
      const auto ks = keys(p, 50);
      ReserveReply r = reserve(c, reg, ks);
      for (std::size_t i = 0; i < ks.size(); ++i) std::memcpy(arena.p + r.offsets[i], object_of(p, i).data(), kObject);
      REQUIRE(must_call(c, Commit{r.reservation, true}).status == Status::ok);
      eventually([&] { return curl(port, "/metrics").body.find("\nkvstrand_server_disk_written_total " +
                                                                std::to_string(50 * p) + "\n") != std::string::npos; },
                 "written");
    }
  }
  // Extent e is in file e % 2: both hold objects.
  const int in_a = headers_in(a.file()), in_b = headers_in(b.file());
  REQUIRE(in_a > 0);
  REQUIRE(in_b > 0);
  REQUIRE(in_a + in_b == 400);
  ServerProcess srv(flags(port));
  REQUIRE(srv.ready());
  REQUIRE(Client(srv.socket_path()).wait_full());
  REQUIRE(curl(port, "/metrics").body.find("\nkvstrand_server_disk_recovered_objects_total 400\n") !=
          std::string::npos);
}

TEST_CASE("disk: a second server on the same disk, and bad --disk flags, are refused naming the flag",
          "[disk][server]") {
  DiskDir d;
  auto refused = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {sibling_binary("../kvstrand-server"), "--socket",
                                     ServerProcess::fresh_socket_path()};
    args.insert(args.end(), extra.begin(), extra.end());
    const ProcessResult r = run_process(args, 20s);  // a flag wrongly accepted: a server that runs on, killed
    INFO(r.output);
    REQUIRE(r.exit_code != 0);
    return r.output;
  };
  auto with = [](std::vector<std::string> extra) {
    std::vector<std::string> f = kFlags;
    f.insert(f.end(), extra.begin(), extra.end());
    return f;
  };
  CHECK_THAT(refused(with({"--disk", d.path})), Catch::Contains("--disk-bytes") && Catch::Contains("needed with --disk"));
  CHECK_THAT(refused(with({"--disk-bytes", "1G"})), Catch::Contains("--disk-bytes") && Catch::Contains("needs --disk"));
  CHECK_THAT(refused(with({"--disk", d.path, "--disk-bytes", "lots"})), Catch::Contains("invalid --disk-bytes"));
  CHECK_THAT(refused(with({"--disk", d.path, "--disk", d.path, "--disk-bytes", "64M"})),
             Catch::Contains("given twice"));
  CHECK_THAT(refused(with({"--disk", d.path, "--disk-bytes", "64M", "--disk-timeout", "0"})),
             Catch::Contains("invalid --disk-timeout"));
  CHECK_THAT(refused({"--tier-bytes", "16M", "--slab-bytes", "4M", "--disk", d.path, "--disk-bytes", "1M"}),
             Catch::Contains("--disk-bytes") && Catch::Contains("less than one extent") && Catch::Contains("--slab-bytes"));
  // More than the file system has free: refused before anything is written.
  struct statvfs vfs{};
  REQUIRE(::statvfs(d.path.c_str(), &vfs) == 0);
  const std::uint64_t too_much = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize + (64ull << 30);
  CHECK_THAT(refused({"--tier-bytes", "16M", "--slab-bytes", "4M", "--disk", d.path, "--disk-bytes",
                      std::to_string(too_much >> 20) + "M"}),
             Catch::Contains("--disk-bytes") && Catch::Contains("free"));
  // One server per disk file.
  Node n(d);
  CHECK_THAT(refused(disk_flags(d, free_port())), Catch::Contains("--disk") && Catch::Contains("another kvstrand-server"));
  n.store(1, 4);
  REQUIRE(n.load(1, 4) == 4);
}

TEST_CASE("disk: a symbolic link, or a file kvstrand did not make, is refused naming --disk and left as it is",
          "[disk][server]") {
  DiskDir d;
  auto refused = [](const std::string& disk) {
    std::vector<std::string> args = {sibling_binary("../kvstrand-server"), "--socket",
                                     ServerProcess::fresh_socket_path()};
    args.insert(args.end(), kFlags.begin(), kFlags.end());
    for (const std::string& a : {std::string("--disk"), disk, std::string("--disk-bytes"), std::string("64M")})
      args.push_back(a);
    const ProcessResult r = run_process(args, 20s);
    INFO(r.output);
    REQUIRE(r.exit_code != 0);
    return r.output;
  };
  // A bool, not the strings: Catch would print megabytes on a failure.
  auto unchanged = [](const std::string& path, const std::string& want) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {}) == want;
  };
  // Someone else's file, 1 MiB of it, where the disk tier would write.
  const std::string theirs = d.path + "/database.db";
  std::string bytes(1 << 20, '\0');
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131 + 7) & 0xff);
  std::ofstream(theirs, std::ios::binary) << bytes;

  // DIR/kvstrand.disk is a link to it: before, the server followed it and
  // extended the target to 64 MiB of objects.
  REQUIRE(::symlink(theirs.c_str(), d.file().c_str()) == 0);
  CHECK_THAT(refused(d.path), Catch::Contains("--disk") && Catch::Contains("is a symbolic link: give the file itself"));
  CHECK_THAT(refused(d.file()), Catch::Contains("--disk") && Catch::Contains("is a symbolic link: give the file itself"));
  REQUIRE(fs::file_size(theirs) == bytes.size());
  REQUIRE(unchanged(theirs, bytes));
  ::unlink(d.file().c_str());

  // The file itself: before, it was extended and objects written into it.
  CHECK_THAT(refused(theirs), Catch::Contains("--disk") && Catch::Contains("holds data kvstrand did not write"));
  REQUIRE(unchanged(theirs, bytes));
  // Data past the first extent's head is found too.
  const std::string later = d.path + "/later.db";
  std::string mostly_zeros(6u << 20, '\0');
  mostly_zeros[(4u << 20) + 8192] = 'x';  // the second extent's head (a 4 MiB slab and two 4 KiB blocks)
  std::ofstream(later, std::ios::binary) << mostly_zeros;
  CHECK_THAT(refused(later), Catch::Contains("at byte 4202496"));
  REQUIRE(unchanged(later, mostly_zeros));

  // The disk tier's own file (written by a server, then read by the next) is taken.
  {
    Node n(d);
    n.store(1, 4);
    n.written(4);
  }
  Node again(d);
  REQUIRE(again.load(1, 4) == 4);
}
