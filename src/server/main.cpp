// kvstrand-server: the node-wide host tier shared by every engine rank.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <exception>

#include "server/server_options.hpp"
#include "server/tier_server.hpp"

int main(int argc, char** argv) {
  using namespace kvstrand;
  auto parsed = server::parse_server_options(argc, argv);
  if (auto* code = std::get_if<int>(&parsed)) return *code;
  const auto& opt = std::get<server::ServerOptions>(parsed);
  spdlog::set_level(spdlog::level::from_str(opt.log_level));
  try {
    server::TierServer srv(opt);
    srv.start();
    spdlog::info("kvstrand-server listening on {}, tier {:.2f} GiB in slabs of {:.2f} GiB, chunks of {} tokens",
                 opt.socket, static_cast<double>(opt.tier_bytes) / (1ull << 30),
                 static_cast<double>(opt.slab_bytes) / (1ull << 30), opt.chunk_tokens);
    if (opt.http)
      std::printf("kvstrand-server: debug endpoint on http://%s:%u/debug\n", opt.http->address.c_str(), srv.http_port());
    std::fflush(stdout);
    if (!srv.wait()) return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvstrand-server: %s\n", e.what());
    return 1;
  }
  return 0;
}
