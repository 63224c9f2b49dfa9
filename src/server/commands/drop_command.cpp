#include "server/commands/drop_command.hpp"

#include <cstdio>

#include "channel/blocking_client.hpp"

namespace kvstrand::server {

bool parse_namespace(const std::string& hex, kv::Digest* out) {
  if (hex.size() != 2 * out->size()) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < out->size(); ++i) {
    const int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<std::byte>(hi * 16 + lo);
  }
  return true;
}

namespace {

// Sends `request` (of protocol 2.`minor` or later) to the server at
// `socket` for `flag`; `what` says what was dropped.
int send_drop(const std::string& socket, const char* flag, std::uint8_t minor, const proto::Request& request,
              const std::string& what) {
  channel::BlockingClient client;
  const std::string who = std::string("kvstrand-server ") + flag;
  proto::HelloReply hello;
  if (std::string why = client.open(socket, who, &hello); !why.empty()) {
    std::fprintf(stderr, "%s: no server answers at %s: %s\n", who.c_str(), socket.c_str(), why.c_str());
    return 1;
  }
  if (hello.minor < minor) {  // an older server would close the connection on a request it cannot read
    std::fprintf(stderr, "%s: the server at %s speaks protocol %u.%u, and this needs 2.%u\n", who.c_str(),
                 socket.c_str(), unsigned{hello.major}, unsigned{hello.minor}, unsigned{minor});
    return 1;
  }
  auto reply = client.call(request);
  if (!reply || reply->status != proto::Status::ok) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(),
                 reply ? (std::string(proto::to_string(reply->status)) + ": " + reply->message).c_str() : reply.why().c_str());
    return 1;
  }
  const auto& r = std::get<proto::DropReply>(reply->payload);
  std::printf("kvstrand-server at %s dropped %s: %llu objects in the arena, %llu below (L2's in the background)\n",
              socket.c_str(), what.c_str(), static_cast<unsigned long long>(r.arena_objects),
              static_cast<unsigned long long>(r.lower_objects));
  return 0;
}

}  // namespace

int drop_namespace_command(const std::string& socket, const std::string& ns_hex) {
  proto::Drop drop;
  if (!parse_namespace(ns_hex, &drop.ns)) {
    std::fprintf(stderr, "kvstrand-server: invalid --drop-namespace: '%s' is not 64 hex digits\n", ns_hex.c_str());
    return 2;
  }
  return send_drop(socket, "--drop-namespace", 3, drop, "namespace " + ns_hex);
}

int drop_tenant_command(const std::string& socket, const std::string& tenant) {
  return send_drop(socket, "--drop-tenant", 4, proto::DropTenant{tenant}, "tenant " + tenant + "'s namespaces");
}

}  // namespace kvstrand::server
