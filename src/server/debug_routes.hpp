// kvstrand-server's read-only debug endpoint: /healthz (alive), /readyz
// (serving as configured), /debug (a page for a person),
// /debug/sessions, /debug/holds, /debug/tier, /debug/history and /metrics, rendered from
// the server's live state. Every route runs on the server's strand.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "common/accept_backoff.hpp"
#include "common/debug_http.hpp"
#include "common/metrics.hpp"
#include "server/arena_recovery.hpp"
#include "server/levels/disk_tier.hpp"
#include "server/levels/l2_tier.hpp"
#include "server/session.hpp"
#include "server/events/tier_events.hpp"
#include "tier/arena.hpp"
#include "tier/size_classes.hpp"

namespace kvstrand::server {

// The state the routes read, by reference: it must outlive the endpoint.
struct ServerState {
  const bool& stopping;
  const std::map<std::uint64_t, std::shared_ptr<Session>>& sessions;
  const std::map<pid_t, std::shared_ptr<Process>>& processes;
  const tier::SizeClasses& classes;
  const tier::Arena& arena;
  const L2Tier* l2;  // null without --l2
  const DiskTier* disk;  // null without --disk
  const TierEvents* events;  // null without --events
  const tier::TenantBook* tenants;  // the arena's
  const std::uint32_t& mapped_slabs;  // of the server's own mapping, faulted in
  const common::LabeledCounter& requests;
  RequestService& service;  // its miss and hit counters, the namespaces' names, the history
  const std::uint64_t& orphans_freed;
  const common::AcceptBackoff& accept;
  const std::string& fill_error;
  const Recovery& recovery;
  std::function<std::uint64_t()> ready_bytes;  // of the arena and the segments
  std::string socket;
  std::uint64_t segment_bytes = 0;  // the tenants' segments together (--tenant-segment)
  // A tenant map and no token: any local user reads the pages, so the
  // namespaces' digests (with which one tests guessed prompts for
  // membership) are not listed.
  bool hide_namespaces = false;
};

common::HttpRoutes debug_routes(ServerState state);

}  // namespace kvstrand::server
