// The disk tier at the device's speed: kvstrand-server --disk against raw
// O_DIRECT I/O of the same sizes at the same queue depth, in one run, on
// the file system of --dir.
//
// - raw O_DIRECT write: objects of the reference geometry (12.9 MB) written
//   with io_uring, --depth at a time, into a scratch file laid out as the
//   disk tier lays its slots.
// - write-behind: one client commits as many objects at once (bytes filled
//   first); seconds from the commit's reply until the server's
//   kvstrand_server_disk_written_total counts them all.
// - raw O_DIRECT read: the server killed, the same slots of its disk file
//   read back with io_uring, --depth at a time; once before the promotion
//   and once after it (their mean is the baseline).
// - promotion: the server restarted on the disk (a new, empty arena); one
//   lookup of every object, timed from send to reply: the server reads
//   each back into the arena and checks it before answering. Every byte is
//   then compared with what was committed.
// --rounds N (default 3) repeats all of it, each round on a new disk file,
// so each ratio compares runs minutes apart at most; the last two lines are
// the median of the rounds' ratios, which the disk tier is held to (>= 0.9)
// (a VM's disk moves 20-25 % between runs: docs/PERFORMANCE.md).
#include <fcntl.h>
#include <liburing.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <netinet/in.h>
#include <arpa/inet.h>

#include <algorithm>
#include <filesystem>
#include <random>

#include "channel/fd_passing.hpp"
#include "common/free_port.hpp"
#include "bench_server.hpp"
#include "wire.hpp"

using namespace kvstrand;
using namespace kvstrand::bench;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

constexpr std::uint64_t kBlock = 4096;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
std::uint64_t round_up(std::uint64_t n, std::uint64_t to) { return (n + to - 1) / to * to; }

// The server's /metrics (plain HTTP/1.0 over loopback), and a sample of it.
double sample(const std::string& body, const std::string& name) {
  const auto at = body.find("\n" + name + " ");
  return at == std::string::npos ? -1 : std::stod(body.substr(at + name.size() + 2));
}
std::string metrics(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string body;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) body.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return body;
}
double metric(std::uint16_t port, const std::string& name) { return sample(metrics(port), name); }

std::uint16_t free_port() {
  const std::uint16_t port = common::free_port();
  if (port == 0) die("no free port");
  return port;
}

// The server, answering and every slab of its arena ready, its debug
// endpoint (for the disk's counters) on `port`.
struct Server : BenchServer {
  std::uint16_t port = free_port();
  Server() : BenchServer("bench-disk") {}
  void start(const std::vector<std::string>& flags) {
    std::vector<std::string> all = {"--http", "127.0.0.1:" + std::to_string(port)};
    all.insert(all.end(), flags.begin(), flags.end());
    spawn(all);
    const auto t0 = Clock::now();
    for (;;) {
      if (Wire w(socket); w.connected() && w.call(proto::Hello{proto::kMajor, proto::kMinor, "bench_disk"})) {
        const proto::StatsReply s = w.stats();
        // And its own mapping of the arena faulted in (in the background
        // once the slabs are ready): what a server that has run a while has.
        if (s.ready_bytes == s.capacity_bytes &&
            metric(port, "kvstrand_server_tier_mapped_bytes") == double(s.capacity_bytes))
          return;
      }
      if (exited() || seconds_since(t0) > 600) die("the server did not start, or its arena was not ready within 600 s");
      std::this_thread::sleep_for(20ms);
    }
  }
};

// The client: a session, the reference registration, the arena mapped.
struct Client {
  Wire w;
  std::uint32_t reg = 0;
  std::byte* arena = nullptr;
  std::uint64_t arena_bytes = 0;
  explicit Client(const Server& s) : w(s.socket) {
    if (!w.connected()) die("cannot connect");
    int fd = -1;
    auto hello = w.conn.hello("bench_disk", {}, &fd);
    if (!hello || hello->status != proto::Status::ok) die("hello");
    if (fd < 0) die("no arena with the hello reply");
    arena_bytes = w.stats().capacity_bytes;
    void* p = ::mmap(nullptr, arena_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) die("cannot map the arena");
    arena = static_cast<std::byte*>(p);
    auto r = w.call(proto::RegisterLayout{reference_layout()});
    if (!r) die("registration refused");
    reg = std::get<proto::RegisterReply>(r->payload).registration;
  }
  ~Client() {
    if (arena) ::munmap(arena, arena_bytes);
  }
};

// Raw O_DIRECT I/O of `bytes` at each of `offsets`, `depth` at a time, from
// or into `buf` (depth slots of `bytes`). Seconds.
double raw_io(bool write, int fd, const std::vector<std::uint64_t>& offsets, std::uint64_t bytes, unsigned depth,
              std::byte* buf) {
  io_uring ring;
  if (io_uring_queue_init(depth * 2, &ring, 0) < 0) die("io_uring_queue_init");
  iovec v{buf, depth * bytes};
  const bool fixed = io_uring_register_buffers(&ring, &v, 1) == 0;
  std::size_t next = 0, done = 0, in_flight = 0;
  std::vector<unsigned> free_slots;
  for (unsigned i = 0; i < depth; ++i) free_slots.push_back(i);
  const auto t0 = Clock::now();
  while (done < offsets.size()) {
    while (next < offsets.size() && !free_slots.empty()) {
      const unsigned s = free_slots.back();
      free_slots.pop_back();
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      std::byte* at = buf + s * bytes;
      const auto n = static_cast<unsigned>(bytes);
      if (write)
        fixed ? io_uring_prep_write_fixed(sqe, fd, at, n, offsets[next], 0) : io_uring_prep_write(sqe, fd, at, n, offsets[next]);
      else
        fixed ? io_uring_prep_read_fixed(sqe, fd, at, n, offsets[next], 0) : io_uring_prep_read(sqe, fd, at, n, offsets[next]);
      io_uring_sqe_set_data64(sqe, s);
      ++next;
      ++in_flight;
    }
    io_uring_submit(&ring);
    io_uring_cqe* cqe = nullptr;
    if (io_uring_wait_cqe(&ring, &cqe) < 0) die("io_uring_wait_cqe");
    do {
      if (cqe->res != static_cast<int>(bytes)) die(std::string("raw I/O: ") + (cqe->res < 0 ? std::strerror(-cqe->res) : "short"));
      free_slots.push_back(static_cast<unsigned>(io_uring_cqe_get_data64(cqe)));
      io_uring_cqe_seen(&ring, cqe);
      ++done;
      --in_flight;
    } while (io_uring_peek_cqe(&ring, &cqe) == 0 && cqe != nullptr);
  }
  const double s = seconds_since(t0);
  io_uring_queue_exit(&ring);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it is printed: a run cut short keeps what it measured
  std::string dir = std::filesystem::current_path().string();
  double gib = 4;
  int rounds = 3;
  unsigned depth = 32;  // the disk tier's objects in flight (DiskOptions::depth)
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (arg == "--gib" && i + 1 < argc) {
      gib = std::atof(argv[++i]);
    } else if (arg == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: bench_disk [--dir DIR (on the disk to measure)] [--gib GiB of objects] [--rounds N]\n");
      return 2;
    }
  }
  const std::uint64_t object = reference_layout().object_bytes(true);
  const std::uint64_t body = round_up(object, kBlock);
  const auto objects = static_cast<std::uint64_t>(gib * double(1ull << 30) / double(object));
  if (objects < depth) die("--gib too small for " + std::to_string(depth) + " objects");
  // Slabs of 512 MiB; the disk's extents one slab and two blocks each.
  constexpr std::uint64_t kSlab = 512ull << 20;
  const std::uint64_t per_slab = kSlab / body, slot = kBlock + body, extent = kSlab + 2 * kBlock;
  const std::uint64_t per_extent = (extent - kBlock) / slot;
  const std::uint64_t tier = ((objects + per_slab - 1) / per_slab + 1) * kSlab;
  const std::uint64_t disk = ((objects + per_extent - 1) / per_extent + 1) * extent;
  const std::string work = dir + "/bench-disk-" + std::to_string(::getpid());
  std::filesystem::create_directories(work);
  struct Cleanup {
    std::string p;
    ~Cleanup() { std::filesystem::remove_all(p); }
  } cleanup{work};
  std::printf("bench_disk: %llu objects of %.1f MB (%.2f GiB) at %s, %u at a time; arena %llu MiB, disk %llu MiB\n",
              static_cast<unsigned long long>(objects), double(object) / 1e6, double(objects * object) / double(1ull << 30),
              dir.c_str(), depth, static_cast<unsigned long long>(tier >> 20), static_cast<unsigned long long>(disk >> 20));
  // Where the disk tier keeps slot k's object (one file: extent e at e * extent).
  std::vector<std::uint64_t> offsets;
  for (std::uint64_t k = 0; k < objects; ++k)
    offsets.push_back((k / per_extent) * extent + kBlock + (k % per_extent) * slot + kBlock);
  // The raw I/O's buffers, and apart from them the objects' bytes.
  std::byte* buf = static_cast<std::byte*>(std::aligned_alloc(kBlock, depth * body));
  std::vector<std::byte> pattern(depth * body);
  std::mt19937_64 rng(7);
  for (std::uint64_t i = 0; i < depth * body / 8; ++i) {
    const std::uint64_t x = rng();
    std::memcpy(pattern.data() + i * 8, &x, 8);
  }
  std::memcpy(buf, pattern.data(), depth * body);
  const double gb = double(objects * object) / 1e9;
  struct Round {
    double raw_write = 0, behind = 0, raw_read = 0, promoted = 0;
    std::size_t wrong = 0;
  };
  std::vector<Round> done;
  auto one_round = [&](int round) -> Round {
    std::printf("round %d of %d\n", round + 1, rounds);
    std::filesystem::remove(work + "/kvstrand.disk");  // each round writes a new disk
    // Raw write into a scratch file of the disk file's size.
    const std::string scratch = work + "/scratch";
    const int sfd = ::open(scratch.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
    if (sfd < 0 || ::posix_fallocate(sfd, 0, static_cast<off_t>(disk)) != 0) die("cannot make " + scratch);
    // The allocation settled before the timing, as the disk tier's file is
    // (allocated when the server starts): else the file system's journal
    // work for it lands in the raw write's time and flatters the ratio.
    if (::fsync(sfd) != 0) die("fsync " + scratch);
    const double raw_write = gb / raw_io(true, sfd, offsets, body, depth, buf);
    ::close(sfd);
    ::unlink(scratch.c_str());
    std::printf("raw O_DIRECT write: %.2f GB/s\n", raw_write);

    const std::vector<std::string> flags = {
        "--tier-bytes", std::to_string(tier >> 20) + "M", "--slab-bytes", std::to_string(kSlab >> 20) + "M",
        "--chunk-tokens", "256", "--max-client-reserved", std::to_string(tier >> 20) + "M", "--max-client-leased",
        std::to_string(tier >> 20) + "M", "--disk", work, "--disk-bytes", std::to_string(disk >> 20) + "M",
        "--disk-timeout", "60000"};
    Server srv;
    auto phase = [t0 = Clock::now()](const char* what) { std::printf("  [%6.1f s] %s\n", seconds_since(t0), what); };
    phase("starting the server (its arena populated and mapped)");
    srv.start(flags);
    std::vector<kv::ChunkKey> keys;
    {
      Client c(srv);
      // One prompt of `objects` chunks, as the engine saves it.
      kv::Layout l = reference_layout();
      std::vector<std::uint32_t> tokens(objects * l.chunk_tokens);
      for (std::size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<std::uint32_t>(i * 2654435761u);
      keys = kv::chunk_keys(l, kv::namespace_of(l), tokens);
      // The write-behind queue holds an eighth of the arena: the objects are
      // committed in pieces, each once the queue has room for it
      // (a save stream the disk keeps up with). Reserved and filled first:
      // the client's copies are not what is measured.
      const std::uint64_t queue_objects = std::max<std::uint64_t>(1, tier / 8 / object);
      // Pieces small enough that the queue refills before fewer than `depth`
      // objects are in flight (the raw baseline always has `depth`).
      const std::size_t piece = std::max<std::uint64_t>(
          1, queue_objects > depth ? std::min<std::uint64_t>(queue_objects / 2, queue_objects - depth) : 1);
      std::vector<std::uint64_t> reservations;
      for (std::size_t a = 0; a < keys.size(); a += piece) {
        const std::size_t b = std::min(keys.size(), a + piece);
        const std::vector<kv::ChunkKey> part(keys.begin() + static_cast<std::ptrdiff_t>(a),
                                             keys.begin() + static_cast<std::ptrdiff_t>(b));
        auto r = c.w.call(proto::Reserve{c.reg, part, std::vector<std::uint8_t>(part.size(), 1)});
        if (!r) die("reserve refused");
        const auto& res = std::get<proto::ReserveReply>(r->payload);
        for (std::size_t i = a; i < b; ++i) {
          if (res.chunks[i - a] != proto::ChunkState::reserved) die("chunk " + std::to_string(i) + " not reserved");
          std::memcpy(c.arena + res.offsets[i - a], pattern.data() + (i % depth) * body, object);
          std::memcpy(c.arena + res.offsets[i - a], &i, sizeof i);  // each object its own
        }
        reservations.push_back(res.reservation);
      }
      phase(("objects filled in the arena; committing them " + std::to_string(piece) + " at a time").c_str());
      const auto t0 = Clock::now();
      for (std::uint64_t id : reservations) {
        for (;;) {  // a look a millisecond: the server's strand renders each
          const std::string m = metrics(srv.port);
          if (sample(m, "kvstrand_server_disk_write_queue") + sample(m, "kvstrand_server_disk_in_flight") +
                  double(piece) <= double(queue_objects))
            break;
          std::this_thread::sleep_for(1ms);
        }
        if (!c.w.call(proto::Commit{id, true})) die("commit refused");
      }
      while (metric(srv.port, "kvstrand_server_disk_written_total") < double(objects)) {
        if (seconds_since(t0) > 600) die("write-behind did not end within 600 s");
        std::this_thread::sleep_for(1ms);
      }
      const double behind = gb / seconds_since(t0);
      if (const double dropped = metric(srv.port, "kvstrand_server_disk_write_dropped_total"); dropped != 0)
        die("write-behind dropped " + std::to_string(dropped) + " objects");
      const bool registered = metric(srv.port, "kvstrand_server_disk_registered_buffers") == 1;
      srv.kill(SIGKILL);
      std::printf("write-behind: %.2f GB/s (%s)\n", behind, registered ? "registered buffers" : "no registered buffers");

      // Raw read of the disk file's slots, the server gone.
      const int dfd = ::open((work + "/kvstrand.disk").c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
      if (dfd < 0) die("cannot open the disk file");
      const double raw_read1 = gb / raw_io(false, dfd, offsets, body, depth, buf);
      std::printf("raw O_DIRECT read: %.2f GB/s\n", raw_read1);

      phase("restarting the server on its disk");
      srv.start(flags);
      Client c2(srv);
      phase("one lookup of every object");
      const auto t1 = Clock::now();
      auto l2 = c2.w.call(proto::Lookup{c2.reg, keys});
      const double promote_s = seconds_since(t1);
      if (!l2) die("lookup refused");
      const auto& hit = std::get<proto::LookupReply>(l2->payload);
      if (hit.hit.tokens != objects * l.chunk_tokens)
        die("the lookup hit " + std::to_string(hit.hit.tokens / l.chunk_tokens) + " of " + std::to_string(objects) +
            " objects");
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < keys.size(); ++i) {
        std::uint64_t id = 0;
        std::memcpy(&id, c2.arena + hit.offsets[i], sizeof id);
        wrong += id != i || std::memcmp(c2.arena + hit.offsets[i] + 8, pattern.data() + (i % depth) * body + 8, object - 8) != 0;
      }
      const double promoted = gb / promote_s;
      std::printf("promotion: %.2f GB/s (%.0f objects read, %zu wrong)\n", promoted,
                  metric(srv.port, "kvstrand_server_disk_promoted_total"), wrong);
      srv.kill(SIGKILL);
      const double raw_read2 = gb / raw_io(false, dfd, offsets, body, depth, buf);
      ::close(dfd);
      std::printf("raw O_DIRECT read again: %.2f GB/s\n", raw_read2);
      const double raw_read = (raw_read1 + raw_read2) / 2;
      std::printf("  round %d: promotion ratio %.3f, write-behind ratio %.3f\n", round + 1, promoted / raw_read,
                  behind / raw_write);
      return Round{raw_write, behind, raw_read, promoted, wrong};
    }
  };
  std::size_t wrong = 0;
  for (int r = 0; r < rounds; ++r) {
    done.push_back(one_round(r));
    wrong += done.back().wrong;
  }
  std::free(buf);
  // The median round by each ratio, its own figures beside it.
  auto median_by = [&](auto ratio) {
    std::vector<Round> sorted = done;
    std::sort(sorted.begin(), sorted.end(), [&](const Round& a, const Round& b) { return ratio(a) < ratio(b); });
    return sorted[sorted.size() / 2];
  };
  std::string all_p, all_w;
  for (const Round& r : done) {
    all_p += (all_p.empty() ? "" : " ") + std::to_string(r.promoted / r.raw_read).substr(0, 5);
    all_w += (all_w.empty() ? "" : " ") + std::to_string(r.behind / r.raw_write).substr(0, 5);
  }
  const Round p = median_by([](const Round& r) { return r.promoted / r.raw_read; });
  const Round w = median_by([](const Round& r) { return r.behind / r.raw_write; });
  std::printf("rounds' ratios: promotion %s, write-behind %s; %zu objects loaded wrong in all\n", all_p.c_str(),
              all_w.c_str(), wrong);
  std::printf("disk promotion %.2f GB/s, raw O_DIRECT read %.2f GB/s: ratio %.3f (median of %d rounds)\n", p.promoted,
              p.raw_read, p.promoted / p.raw_read, rounds);
  std::printf("disk write-behind %.2f GB/s, raw O_DIRECT write %.2f GB/s: ratio %.3f (median of %d rounds)\n", w.behind,
              w.raw_write, w.behind / w.raw_write, rounds);
  return wrong == 0 ? 0 : 1;
}
