// kvstrand-server: the node-wide host tier shared by every engine rank.
#include <spdlog/spdlog.h>

#include "common/parse_bytes.hpp"

#include <cstdio>
#include <exception>

#include "server/commands/drop_command.hpp"
#include "server/commands/server_check.hpp"
#include "server/server_options.hpp"
#include "server/systemd_notify.hpp"
#include "server/tier_server.hpp"

int main(int argc, char** argv) {
  using namespace kvstrand;
  auto parsed = server::parse_server_options(argc, argv);
  if (auto* code = std::get_if<int>(&parsed)) return *code;
  const auto& opt = std::get<server::ServerOptions>(parsed);
  if (!opt.check.empty()) return server::check_server(opt.check, opt.check_within);
  if (!opt.drop_namespace.empty()) return server::drop_namespace_command(opt.socket, opt.drop_namespace);
  if (!opt.drop_tenant.empty()) return server::drop_tenant_command(opt.socket, opt.drop_tenant);
  spdlog::set_level(spdlog::level::from_str(opt.log_level));
  try {
    server::TierServer srv(opt);
    srv.start();
    spdlog::info("kvstrand-server listening on {}, tier {} in slabs of {}, chunks of {} tokens", opt.socket,
                 common::format_bytes(opt.tier_bytes), common::format_bytes(opt.slab_bytes), opt.chunk_tokens);
    if (!opt.tier_bytes_rounded_from.empty())  // so that a size in the log is never a surprise
      spdlog::info("kvstrand-server: --tier-bytes {} was rounded up to {}, a whole number of slabs",
                   opt.tier_bytes_rounded_from, common::format_bytes(opt.tier_bytes));
    // The endpoint logs its own address at info; said here (once) when the log is quieter.
    if (opt.http && !spdlog::should_log(spdlog::level::info))
      std::printf("kvstrand-server: debug endpoint on http://%s:%u/debug\n", opt.http->address.c_str(), srv.http_port());
    std::fflush(stdout);
    // Listening: a supervisor's Type=notify unit is started (clients may
    // connect now; /readyz says when the arena is whole).
    server::notify_supervisor("READY=1\nSTATUS=listening on " + opt.socket);
    if (!srv.wait()) return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvstrand-server: %s\n", e.what());
    return 1;
  }
  return 0;
}
