// kvstrand-server --socket SOCKET --drop-namespace NS: has the server at
// SOCKET drop every object of namespace NS (64 hex digits, as /debug/tier
// lists them and kvstrand.namespace_of gives them), in its arena, its disk
// and L2, for an operator's weight update. --drop-tenant NAME: every
// namespace the node holds the tenant's objects of (protocol 2.4). Blocking,
// bounded.
#pragma once

#include <string>

#include <kvstrand/digest.hpp>

namespace kvstrand::server {

// 0 once the server dropped it (what it dropped said on stdout), 1 when no
// server answered or it refused (why on stderr).
int drop_namespace_command(const std::string& socket, const std::string& ns_hex);
int drop_tenant_command(const std::string& socket, const std::string& tenant);

// The namespace of 64 hex digits, or nothing for anything else.
bool parse_namespace(const std::string& hex, kv::Digest* out);

}  // namespace kvstrand::server
