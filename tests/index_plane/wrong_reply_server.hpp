// A kvstrand-server stand-in for the node tier's tests of a server that
// answers wrongly (reply types, offsets past the arena).
#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "proto/protocol.hpp"
#include "server_process.hpp"
#include "tier/arena.hpp"
#include "channel/fd_passing.hpp"

namespace kvstrand::test {

// A server in this process that speaks protocol 2 through hello and
// register, then answers wrongly. wrong_types: every other request gets a
// reply of another type (a lookup reply to a reserve, a reserve reply to
// the rest). offsets_past(n): reserves and lookups are granted at offsets
// n bytes past the last object that fits the arena (0: the last one).
// speaking_minor(m): a server of protocol 2.m (its hello reply says so).
// It counts the releases and drops it is sent, and drop() closes its connection
// (the same server, and the same arena, stay for the next one).
class WrongReplyServer {
 public:
  struct Mode {
    bool wrong_types;
    std::uint64_t past;
    std::uint8_t minor = kMinor;
  };
  static Mode wrong_types() { return {true, 0}; }
  static Mode offsets_past(std::uint64_t n) { return {false, n}; }
  static Mode speaking_minor(std::uint8_t m) { return {false, 0, m}; }

  explicit WrongReplyServer(Mode mode)
      : mode_(mode), path_(ServerProcess::fresh_socket_path()), arena_({4u << 20, 2u << 20, false, {}}) {
    listen_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path_.c_str());
    if (::bind(listen_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_, 4) != 0)
      throw std::runtime_error("WrongReplyServer: cannot listen on " + path_);
    for (std::uint32_t s = 0; s < arena_.slab_count(); ++s) (void)arena_.populate(s);
    thread_ = std::thread([this] { serve(); });
  }
  ~WrongReplyServer() {
    stopping_ = true;
    ::shutdown(listen_, SHUT_RDWR);
    if (conn_ >= 0) ::shutdown(conn_, SHUT_RDWR);
    thread_.join();
    ::close(listen_);
    if (conn_ >= 0) ::close(conn_);
    ::unlink(path_.c_str());
  }
  const std::string& socket_path() const { return path_; }
  // Releases received, and the last one's hold.
  int releases() const { return releases_; }
  std::uint64_t last_released() const { return last_released_; }
  int drops() const { return drops_; }
  // Reserves that carried chunk events, registrations that named a tenant (protocol 2.4).
  int described() const { return described_; }
  int tenants() const { return tenants_; }
  void drop() {
    if (conn_ >= 0) ::shutdown(conn_, SHUT_RDWR);
  }
  // While held, a new connection waits in the listen queue: its connect
  // succeeds and its hello goes unanswered until hold_accepts(false).
  void hold_accepts(bool held) { held_ = held; }

 private:
  bool read_all(int fd, void* p, std::size_t n) {
    auto* b = static_cast<char*>(p);
    while (n > 0) {
      const ssize_t r = ::read(fd, b, n);
      if (r <= 0) return false;
      b += r;
      n -= static_cast<std::size_t>(r);
    }
    return true;
  }
  void serve() {
    for (;;) {
      while (held_ && !stopping_) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      const int c = ::accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;  // the destructor shut the listener down
      if (conn_ >= 0) ::close(conn_);
      conn_ = c;
      answer();
    }
  }
  void answer() {
    using namespace proto;
    std::array<std::byte, kHeaderBytes> head{};
    while (read_all(conn_, head.data(), head.size())) {
      Header h;
      if (decode_header(head, kDefaultMaxBody, &h) != HeaderError::none) return;
      std::vector<std::byte> body(h.body_bytes);
      if (!read_all(conn_, body.data(), body.size())) return;
      auto req = decode_request(h.type, body);
      if (!req) return;
      const Type type = type_of(*req);
      if (type == Type::release) {
        last_released_ = std::get<Release>(*req).hold;
        ++releases_;
      }
      if (type == Type::drop) ++drops_;
      if (type == Type::register_layout && !std::get<RegisterLayout>(*req).layout.tenant.empty()) {
        ++tenants_;
        if (mode_.minor < 4) return;  // a 2.3 server's decoder refuses the bytes after the layout
      }
      if (type == Type::reserve && !std::get<Reserve>(*req).events.empty()) {
        ++described_;
        if (mode_.minor < 4) return;  // a 2.3 server's decoder refuses the bytes after the images
      }
      std::vector<std::byte> out;
      if (type == Type::hello) {
        HelloReply hr{1, kMajor, mode_.minor, arena_.bytes(), arena_.slab_bytes(), arena_.bytes(), false};
        out = encode_reply(type, h.request_id, Reply{Status::ok, "", hr});
        if (channel::send_with_fd(conn_, out.data(), out.size(), arena_.fd(), MSG_NOSIGNAL) != static_cast<ssize_t>(out.size()))
          return;
        continue;
      }
      if (type == Type::register_layout) {
        const kv::Layout& l = std::get<RegisterLayout>(*req).layout;
        object_ = l.object_bytes(l.has_state());
        chunk_ = l.chunk_tokens;
        out = encode_reply(type, h.request_id, Reply{Status::ok, "", RegisterReply{1, object_}});
      } else if (!mode_.wrong_types) {
        const std::uint64_t at = arena_.bytes() - object_ + mode_.past;
        if (type == Type::reserve) {
          const std::size_t n = std::get<Reserve>(*req).keys.size();
          out = encode_reply(type, h.request_id,
                             Reply{Status::ok, "", ReserveReply{7, std::vector<ChunkState>(n, ChunkState::reserved),
                                                                std::vector<std::uint64_t>(n, at)}});
        } else if (type == Type::lookup) {
          const auto n = static_cast<std::uint32_t>(std::get<Lookup>(*req).keys.size());
          out = encode_reply(type, h.request_id,
                             Reply{Status::ok, "", LookupReply{9, kv::HitSource{n * chunk_, {n * chunk_}},
                                                               std::vector<std::uint64_t>(n, at)}});
        } else {
          out = encode_reply(type, h.request_id, Reply{});
        }
      } else if (type == Type::reserve) {
        out = encode_reply(Type::lookup, h.request_id, Reply{Status::ok, "", LookupReply{}});
      } else {
        out = encode_reply(Type::reserve, h.request_id, Reply{Status::ok, "", ReserveReply{}});
      }
      // MSG_NOSIGNAL: a client gone meanwhile (it reconnects at once) is an error here, not a SIGPIPE.
      if (::send(conn_, out.data(), out.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(out.size())) return;
    }
  }

  Mode mode_;
  std::uint64_t object_ = 0;
  std::uint32_t chunk_ = 0;
  std::string path_;
  tier::Arena arena_;
  int listen_ = -1;
  std::atomic<int> conn_{-1};
  std::atomic<int> releases_{0};
  std::atomic<int> drops_{0};
  std::atomic<int> described_{0};
  std::atomic<int> tenants_{0};
  std::atomic<bool> held_{false}, stopping_{false};
  std::atomic<std::uint64_t> last_released_{0};
  std::thread thread_;
};

}  // namespace kvstrand::test
