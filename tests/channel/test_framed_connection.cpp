// channel::FramedConnection: the protocol's connection, as both ends use it,
// over a socket pair (no server).
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/local/connect_pair.hpp>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "channel/framed_connection.hpp"

using namespace kvstrand;
using namespace std::chrono_literals;
namespace asio = boost::asio;
using channel::FramedConnection;
using channel::ReadFrame;

namespace {

// A lookup of `keys` chunks: a real frame.
std::vector<std::byte> frame(std::uint64_t id, std::size_t keys) {
  proto::Lookup l;
  l.registration = 1;
  l.keys.resize(keys);
  for (std::size_t i = 0; i < keys; ++i) l.keys[i].kv_rank = static_cast<std::uint32_t>(i);
  return proto::encode_request(l, id);
}

std::vector<std::byte> body_of(const std::vector<std::byte>& f) {
  return {f.begin() + proto::kHeaderBytes, f.end()};
}

// Two connected ends on one strand, each's ends told to `why_a` / `why_b`.
struct Pair {
  Pair() : strand(asio::make_strand(ctx)), gate(strand) {
    FramedConnection::Socket sa(strand), sb(strand);
    asio::local::connect_pair(sa, sb);
    a = std::make_shared<FramedConnection>(std::move(sa), strand, gate, [this](const std::string& w) { why_a = w; });
    b = std::make_shared<FramedConnection>(std::move(sb), strand, gate, [this](const std::string& w) { why_b = w; });
  }
  ~Pair() {
    a->close();
    b->close();
    bool done = false;  // what runs inside the gate ends
    asio::co_spawn(strand, gate.close(1s), [&](std::exception_ptr, bool) { done = true; });
    const auto until = std::chrono::steady_clock::now() + 2s;
    while (!done && std::chrono::steady_clock::now() < until) run_one();
  }

  // Runs `work` on the strand to its end (at most 10 s); its result.
  template <class T>
  T run(asio::awaitable<T> work) {
    std::optional<T> out;
    std::exception_ptr failed;
    asio::co_spawn(strand, std::move(work), [&](std::exception_ptr e, T v) {
      failed = e;
      out = std::move(v);
    });
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!out && std::chrono::steady_clock::now() < until) run_one();
    if (failed) std::rethrow_exception(failed);
    REQUIRE(out.has_value());
    return std::move(*out);
  }
  ReadFrame read(FramedConnection& c, std::uint32_t max_body = proto::kDefaultMaxBody, int* fd = nullptr) {
    return run(c.read(max_body, fd));
  }
  // Runs handlers for `d` (what the writers do meanwhile).
  void pump(std::chrono::milliseconds d) {
    restart();
    ctx.run_for(d);
  }
  void run_one() {
    restart();
    ctx.run_one_for(100ms);
  }
  // An io_context that ran out of work is stopped until restarted.
  void restart() {
    if (ctx.stopped()) ctx.restart();
  }

  asio::io_context ctx;
  common::Strand strand;
  common::Gate gate;
  std::shared_ptr<FramedConnection> a, b;
  std::optional<std::string> why_a, why_b;
};

}  // namespace

TEST_CASE("framed connection: frames arrive whole and in order, a descriptor with its frame's first byte",
          "[common]") {
  Pair p;
  const int memfd = ::memfd_create("kvstrand-test", MFD_CLOEXEC);
  REQUIRE(memfd >= 0);
  // The second and third bodies are several of read()'s 64 KiB pieces.
  const std::vector<std::vector<std::byte>> sent = {frame(1, 3), frame(2, 5000), frame(3, 20000)};
  p.a->send(sent[0], memfd);
  p.a->send(sent[1]);
  p.a->send(sent[2]);
  int got_fd = -2;
  ReadFrame f = p.read(*p.b, proto::kDefaultMaxBody, &got_fd);
  REQUIRE_FALSE(f.io);
  REQUIRE(f.header == proto::HeaderError::none);
  REQUIRE(f.h.request_id == 1);
  REQUIRE(f.body == body_of(sent[0]));
  // The descriptor that came is the file that was sent.
  REQUIRE(got_fd >= 0);
  struct stat x{}, y{};
  REQUIRE(::fstat(memfd, &x) == 0);
  REQUIRE(::fstat(got_fd, &y) == 0);
  REQUIRE(x.st_ino == y.st_ino);
  ::close(got_fd);
  ::close(memfd);
  for (std::uint64_t id : {2, 3}) {
    f = p.read(*p.b);
    REQUIRE_FALSE(f.io);
    REQUIRE(f.h.request_id == id);
    REQUIRE(f.body == body_of(sent[id - 1]));
  }
  p.pump(20ms);
  REQUIRE(p.a->queued_bytes() == 0);
  REQUIRE_FALSE(p.why_a);
}

TEST_CASE("framed connection: a header announcing more than the reader takes is refused, its body unread",
          "[common]") {
  Pair p;
  p.a->send(frame(7, 1000));
  ReadFrame f = p.read(*p.b, 1024);
  REQUIRE_FALSE(f.io);
  REQUIRE(f.header == proto::HeaderError::too_large);
  REQUIRE(f.h.request_id == 7);
  REQUIRE(f.body.empty());
}

TEST_CASE("framed connection: closed after its last frame, the peer reads every queued frame, then the end",
          "[common]") {
  Pair p;
  for (std::uint64_t id = 1; id <= 3; ++id) p.a->send(frame(id, 4000));
  p.a->close_after_flush("closed after its last reply");
  REQUIRE_FALSE(p.a->closed());  // not before what is queued has gone
  for (std::uint64_t id = 1; id <= 3; ++id) {
    ReadFrame f = p.read(*p.b);
    REQUIRE_FALSE(f.io);
    REQUIRE(f.h.request_id == id);
  }
  ReadFrame end = p.read(*p.b);
  REQUIRE(end.io == asio::error::eof);
  REQUIRE(p.a->closed());
  REQUIRE(p.why_a == "closed after its last reply");
  // Nothing is queued once closed.
  p.a->send(frame(4, 1));
  REQUIRE(p.a->queued_bytes() == 0);
}

TEST_CASE("framed connection: a peer gone fails the write: the connection ends itself and says why", "[common]") {
  Pair p;
  p.b->close();
  p.a->send(frame(1, 10));
  p.pump(100ms);
  REQUIRE(p.a->closed());
  REQUIRE(p.a->queued_bytes() == 0);
  REQUIRE(p.why_a.has_value());
  INFO(*p.why_a);
  REQUIRE(p.why_a->rfind("write failed: ", 0) == 0);
  REQUIRE_FALSE(p.why_b);  // closed by its owner: not told
}

TEST_CASE("framed connection: drained_to waits while more than its limit is queued, until the peer reads or the "
          "connection ends",
          "[common]") {
  Pair p;
  // Far more than a socket buffer: most of it stays queued while b does not read.
  for (std::uint64_t id = 1; id <= 40; ++id) p.a->send(frame(id, 2000));
  p.pump(50ms);
  REQUIRE(p.a->queued_bytes() > 64 * 1024);
  bool drained = false;
  asio::co_spawn(p.strand, p.a->drained_to(64 * 1024), [&](std::exception_ptr) { drained = true; });
  p.pump(100ms);
  REQUIRE_FALSE(drained);
  // The peer reads: the queue shrinks and the waiter goes on.
  std::size_t frames = 0;
  while (!drained && frames < 40) {
    REQUIRE_FALSE(p.read(*p.b).io);
    ++frames;
    p.pump(1ms);
  }
  REQUIRE(drained);
  REQUIRE(p.a->queued_bytes() <= 64 * 1024);

  // A waiter on a connection that ends goes on too.
  for (std::uint64_t id = 41; id <= 80; ++id) p.a->send(frame(id, 2000));
  p.pump(50ms);
  bool ended = false;
  asio::co_spawn(p.strand, p.a->drained_to(64 * 1024), [&](std::exception_ptr) { ended = true; });
  p.pump(50ms);
  REQUIRE_FALSE(ended);
  p.a->close();
  p.pump(50ms);
  REQUIRE(ended);
}

TEST_CASE("framed connection: closed mid-write, the writer ends and the gate closes", "[common]") {
  Pair p;
  p.a->send(frame(1, 60000));  // 4.5 MiB: the write is still running when it closes
  p.pump(20ms);
  REQUIRE(p.a->queued_bytes() > 0);
  p.a->close();
  std::optional<bool> closed;
  asio::co_spawn(p.strand, p.gate.close(5s), [&](std::exception_ptr, bool ok) { closed = ok; });
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (!closed && std::chrono::steady_clock::now() < until) p.run_one();
  REQUIRE(closed == true);
  REQUIRE_FALSE(p.why_a);  // closed by its owner: not told
}
