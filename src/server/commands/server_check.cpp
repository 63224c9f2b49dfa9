#include "server/commands/server_check.hpp"

#include <cstdio>
#include <thread>

#include "common/parse_bytes.hpp"
#include "channel/blocking_client.hpp"

namespace kvstrand::server {

int check_server(const std::string& socket, std::chrono::milliseconds within) {
  const auto end = std::chrono::steady_clock::now() + within;
  std::string why;
  for (;;) {
    channel::BlockingClient client;
    proto::HelloReply hr;
    why = client.open(socket, "kvstrand-server --check", &hr);
    if (why.empty()) {
      std::printf("kvstrand-server at %s answers: protocol %u.%u, arena %s\n", socket.c_str(), unsigned{hr.major},
                  unsigned{hr.minor}, common::format_bytes(hr.arena_bytes).c_str());
      return 0;
    }
    if (std::chrono::steady_clock::now() >= end) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::fprintf(stderr, "kvstrand-server --check: no server answers at %s: %s\n", socket.c_str(), why.c_str());
  return 1;
}

}  // namespace kvstrand::server
