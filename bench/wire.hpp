#pragma once

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "channel/blocking_client.hpp"
#include "proto/protocol.hpp"
#include "reference_geometry.hpp"

namespace kvstrand::bench {

// One connection to kvstrand-server speaking its protocol, blocking: what
// a benchmark asks the server directly (stats, a filler's reserves and
// commits, lookups), with no device and no copy.
struct Wire {
  // No bound a benchmark would notice (a filler's reserve can wait on slabs).
  channel::BlockingClient conn{std::chrono::seconds(600)};
  explicit Wire(const std::string& socket) { (void)conn.connect(socket); }
  bool connected() const { return conn.connected(); }
  // The reply when the server answered ok; nothing otherwise.
  std::optional<proto::Reply> call(const proto::Request& req) {
    auto reply = conn.call(req);  // a hello's arena descriptor is closed there
    if (!reply || reply->status != proto::Status::ok) return {};
    return std::move(*reply);
  }
  // Hello and the reference layout's registration (0: refused).
  std::uint32_t open() {
    if (!connected() || !call(proto::Hello{proto::kMajor, proto::kMinor, "bench"})) return 0;
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
