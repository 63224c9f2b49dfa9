// What the node tier's tests share: a Connector's options for a server
// process, the server's flags, and the waits their cases repeat.
#pragma once

#include <chrono>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "connector_rig.hpp"
#include "server_process.hpp"
#include "support.hpp"

namespace kvstrand::test {

using namespace std::chrono_literals;
using kvstrand::FailStop;
using kvstrand::TransferErrc;

inline connector::ConnectorOptions remote(const ServerProcess& srv, std::chrono::milliseconds deadline = 60s) {
  connector::ConnectorOptions o;
  o.server_socket = srv.socket_path();
  o.transfer_deadline = deadline;
  o.server_request_timeout = 2s;
  return o;
}

inline const std::vector<std::string> kServerFlags = {"--tier-bytes", "32M", "--slab-bytes", "8M", "--chunk-tokens", "64"};

// Saves prompt 1's chunks 0 and 1 from `src`, then looks them up: the
// lookup's outcome (its lease held by this process).
auto save_and_look_up(Rig& rig, const auto& src) {
  rig.conn->save(rig.save_spec("a", 1, 0, 2, src));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); }).saves[0].ok);
  rig.conn->lookup(rig.keys(1, 0, 2));
  return rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); }).lookups[0];
}

// `adopter` as a scheduler of `layout` (a registration without memory)
// adopts the hand-off; what its finished() then holds: the one lookup.
inline kvstrand::Finished adopt_in(connector::Connector& adopter, const kv::Layout& layout,
                                   const std::vector<std::byte>& handoff) {
  Registration plan_only;
  plan_only.layout = layout;
  adopter.register_layout(plan_only);
  adopter.adopt_lease(handoff);
  kvstrand::Finished f;
  for (auto end = std::chrono::steady_clock::now() + 10s; f.lookups.empty() && std::chrono::steady_clock::now() < end;
       std::this_thread::sleep_for(5ms))
    f = adopter.finished();
  REQUIRE(f.lookups.size() == 1);
  return f;
}

// Polls finished() until it throws FailStop (its code) or `within` passes (none).
inline std::error_code wait_fail_stop(Rig& rig, std::chrono::milliseconds within = 10s) {
  const auto end = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < end) {
    try {
      rig.conn->finished();
      std::this_thread::sleep_for(5ms);
    } catch (const FailStop& e) {
      return e.code();
    }
  }
  return {};
}

// Saves `spec` until one ends ok (a connector between connect attempts turns
// requests away at once), at most `within`; each failure must be the tier's
// absence. True once saved.
inline bool save_until_ok(Rig& rig, kv::TransferSpec spec, std::chrono::milliseconds within = 10s) {
  const auto end = std::chrono::steady_clock::now() + within;
  for (int attempt = 0; std::chrono::steady_clock::now() < end; ++attempt) {
    spec.request = "until-ok-" + std::to_string(attempt);
    rig.conn->submit({{kvstrand::TransferKind::save, spec, nullptr}});
    auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.saves.empty(); });
    if (f.saves[0].ok) return true;
    INFO(f.saves[0].reason);
    REQUIRE(f.saves[0].error == TransferErrc::tier_unavailable);
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

inline std::uint32_t lookup_tokens(Rig& rig, std::vector<kv::ChunkKey> keys, std::uint32_t registration = 0) {
  rig.conn->lookup(std::move(keys), registration);
  return rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); }).lookups[0].hit.tokens;
}

// After its server restarted (prompt 1 was saved to the old one): saves
// succeed once the connector has attached again (in the background, on its
// backoff's clock; tier_unavailable until then), prompt 1 is gone, and
// prompt 2 loads back byte for byte.
inline void serves_anew_after_restart(Rig& rig) {
  const auto src = Rig::block_range(8, 8);
  const auto before = rig.snapshot(src, {1});
  REQUIRE(save_until_ok(rig, rig.save_spec("b", 2, 0, 2, src)));
  rig.conn->lookup(rig.keys(1, 0, 2));
  REQUIRE(rig.wait_for([](const kvstrand::Finished& f) { return !f.lookups.empty(); }).lookups[0].hit.tokens == 0);
  rig.randomize(3);
  const auto dst = Rig::block_range(30, 8);
  rig.conn->load(rig.load_spec("b", 2, 0, 2, dst, 6));  // no lease: the tier holds what it loads
  auto f = rig.wait_for([](const kvstrand::Finished& f) { return !f.loads.empty(); });
  INFO(f.loads[0].reason);
  REQUIRE(f.loads[0].ok);
  REQUIRE(rig.snapshot(dst, {6}) == before);
}

}  // namespace kvstrand::test
