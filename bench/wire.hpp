#pragma once

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "proto/protocol.hpp"
#include "reference_geometry.hpp"

namespace kvstrand::bench {

// One connection to kvstrand-server speaking its protocol, blocking: what
// a benchmark asks the server directly (stats, a filler's reserves and
// commits, lookups), with no device and no copy.
struct Wire {
  int fd = -1;
  std::uint64_t id = 1;
  explicit Wire(const std::string& socket) {
    fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket.c_str());
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      fd = -1;
    }
  }
  ~Wire() {
    if (fd >= 0) ::close(fd);
  }
  std::optional<proto::Reply> call(const proto::Request& req) {
    const auto frame = proto::encode_request(req, id++);
    if (::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(frame.size())) return {};
    std::array<std::byte, proto::kHeaderBytes> head{};
    if (::recv(fd, head.data(), head.size(), MSG_WAITALL) != static_cast<ssize_t>(head.size())) return {};
    proto::Header h;
    if (proto::decode_header(head, proto::kDefaultMaxBody, &h) != proto::HeaderError::none) return {};
    std::vector<std::byte> body(h.body_bytes);
    if (!body.empty() && ::recv(fd, body.data(), body.size(), MSG_WAITALL) != static_cast<ssize_t>(body.size()))
      return {};
    auto reply = proto::decode_reply(h.type, body);  // the hello's arena fd is dropped by recv
    if (!reply || reply->status != proto::Status::ok) return {};
    return std::move(*reply);
  }
  // Hello and the reference layout's registration (0: refused).
  std::uint32_t open() {
    if (fd < 0 || !call(proto::Hello{proto::kMajor, proto::kMinor, "bench"})) return 0;
    auto r = call(proto::RegisterLayout{reference_layout()});
    return r ? std::get<proto::RegisterReply>(r->payload).registration : 0;
  }
  proto::StatsReply stats() {
    auto r = call(proto::Stats{});
    if (!r) die("no stats reply");
    return std::get<proto::StatsReply>(r->payload);
  }
};

}  // namespace kvstrand::bench
