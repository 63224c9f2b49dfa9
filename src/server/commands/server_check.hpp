// kvstrand-server --check SOCKET: whether a server answers at SOCKET, for
// scripts, supervisors and container probes (exit 0 once a hello is
// answered). Blocking, bounded; talks the protocol as a client does.
#pragma once

#include <chrono>
#include <string>

namespace kvstrand::server {

// Tries until `within` has passed (one try when it is 0): 0 once a server
// at `socket` answered a hello (said on stdout, with its arena), 1 if none
// did (the last reason on stderr).
int check_server(const std::string& socket, std::chrono::milliseconds within);

}  // namespace kvstrand::server
