#include "server/debug_routes.hpp"

#include <boost/json.hpp>

#include <kvstrand/version.hpp>

#include "common/debug_page.hpp"
#include "server/debug_summary.hpp"
#include "proto/protocol.hpp"

#include <algorithm>
#include <kvstrand/digest.hpp>

namespace kvstrand::server {

using tier::Index;

namespace {

constexpr std::size_t kListedNamespaces = 64;  // /debug/tier lists the largest namespaces, at most these
// /debug/sessions and /debug/holds list at most these (the first by id):
// a page is built on the strand, and its cost must not grow with what
// clients choose to hold. /debug/tier and /metrics count them all.
constexpr std::size_t kListedSessions = 1000;
constexpr std::size_t kListedHolds = 1000;

boost::json::array size_classes_json(const tier::SizeClasses& classes) {
  boost::json::array a;
  for (const auto& c : classes.classes())
    a.push_back(boost::json::object{{"object_bytes", c.object_bytes}, {"slabs", c.slabs}});
  return a;
}

}  // namespace

common::HttpRoutes debug_routes(ServerState state) {
  namespace json = boost::json;
  common::HttpRoutes r;
  r["/healthz"] = [st = state] {
    return common::HttpResponse{st.stopping ? 503u : 200u, "text/plain", st.stopping ? "stopping\n" : "ok\n"};
  };
  // Ready to serve as configured: the arena's every slab populated (a
  // named arena's objects were recovered before the endpoint opened), no
  // failure growing it, not stopping. Until then 503, saying which.
  r["/readyz"] = [st = state] {
    const std::uint64_t ready = st.ready_bytes(), all = st.arena.bytes() + st.segment_bytes;
    std::string why;
    if (st.stopping) why = "stopping";
    else if (!st.fill_error.empty()) why = "the arena could not be populated: " + st.fill_error;
    else if (ready < all) why = "the arena is being populated: " + std::to_string(ready >> 20) + " of " +
                                std::to_string(all >> 20) + " MiB";
    return why.empty() ? common::HttpResponse{200u, "text/plain", "ready\n"}
                       : common::HttpResponse{503u, "text/plain", "not ready: " + why + "\n"};
  };
  r["/debug/sessions"] = [st = state] {
    // What each process holds, counted in one pass over the holds (not one
    // pass per session).
    std::map<tier::Owner, Index::Held> held;
    for (const auto& [id, h] : st.classes.holds()) {
      Index::Held& x = held[h.first];
      ++(h.second ? x.leases : x.reservations);
    }
    json::array a;
    const auto now = Clock::now();
    for (const auto& [id, s] : st.sessions) {
      if (a.size() == kListedSessions) break;
      const Index::Held& h = held[s->process->owner];
      a.push_back(json::object{{"session", id},
                               {"pid", s->process->pid},
                               {"hello", s->client.hello},
                               {"registrations", s->client.regs.size()},
                               {"requests", s->requests},
                               {"age_ms", std::chrono::duration<double, std::milli>(now - s->started).count()},
                               {"replies_queued_bytes", s->conn->queued_bytes()},
                               {"process_leases", h.leases},
                               {"process_reservations", h.reservations}});
    }
    return common::HttpResponse{200, "application/json", json::serialize(a)};
  };
  r["/debug/holds"] = [st = state] {
    std::map<tier::Owner, pid_t> pid_of;
    for (const auto& [p, proc] : st.processes) pid_of[proc->owner] = p;
    json::array a;
    for (const auto& [id, h] : st.classes.holds()) {
      if (a.size() == kListedHolds) break;
      const auto p = pid_of.find(h.first);
      a.push_back(json::object{
          {"hold", id}, {"kind", h.second ? "lease" : "reservation"}, {"pid", p == pid_of.end() ? 0 : p->second}});
    }
    return common::HttpResponse{200, "application/json", json::serialize(a)};
  };
  r["/debug/tier"] = [st = state] {
    const tier::Index::Stats t = st.classes.stats();
    json::object o{{"configured_bytes", st.arena.bytes()},  {"ready_bytes", st.ready_bytes()},
                   {"segment_bytes", st.segment_bytes},
                   {"slab_bytes", st.arena.slab_bytes()},   {"huge_pages", st.arena.huge_pages()},
                   {"size_classes", size_classes_json(st.classes)},
                   {"used_bytes", t.used_bytes},         {"objects", t.objects},
                   {"leased_objects", t.pinned},         {"writing", t.writing},
                   {"leases", t.leases},                 {"reservations", t.reservations},
                   {"evictions", t.evictions},           {"refused_full", t.refused_full},
                   {"lookup_chunk_hits", t.lookup_hits}, {"lookup_misses", t.lookup_misses},
                   {"freed_at_process_exit", st.orphans_freed}, {"accept_errors", st.accept.failures()}};
    // The largest first: what a --drop-namespace would free.
    std::vector<std::pair<std::uint64_t, kv::Digest>> by_size;
    for (const auto& [ns, bytes] : st.classes.namespace_bytes()) by_size.push_back({bytes, ns});
    std::sort(by_size.begin(), by_size.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
    json::array namespaces;
    const auto& names = st.service.namespace_names();
    for (std::size_t i = 0; i < by_size.size() && i < kListedNamespaces && !st.hide_namespaces; ++i) {
      json::object one{{"namespace", kv::to_hex(by_size[i].second)}, {"bytes", by_size[i].first}};
      // What it is, where a registration said (none yet after a restart).
      const auto name = names.find(by_size[i].second);
      one["model"] = name == names.end() ? "" : name->second.model;
      one["layout"] = name == names.end() ? "" : name->second.layout;
      one["tenant"] = name == names.end() ? "" : name->second.tenant;
      namespaces.push_back(std::move(one));
    }
    o["namespaces"] = std::move(namespaces);
    if (st.hide_namespaces)
      o["namespaces_hidden"] = "tenants are bound to users and these pages need no token: give --http-token-file";
    json::array tenants;
    for (const tier::TenantBook::Tenant& t : st.tenants ? st.tenants->all() : std::vector<tier::TenantBook::Tenant>{}) {
      json::object one{{"tenant", t.name}, {"bytes", t.used}, {"evictions", t.evicted}};
      if (t.quota != tier::TenantBook::kNoQuota) one["quota_bytes"] = t.quota;
      tenants.push_back(std::move(one));
    }
    o["tenants"] = std::move(tenants);
    if (!st.fill_error.empty()) o["fill_error"] = st.fill_error;
    if (st.recovery.named) {
      json::object rec{{"path", st.arena.path()},
                       {"reopened", st.recovery.reopened},
                       {"objects_recovered", st.recovery.objects},
                       {"dropped_uncommitted", st.recovery.dropped_uncommitted},
                       {"dropped_corrupt", st.recovery.dropped_corrupt},
                       {"seconds", st.recovery.seconds}};
      if (!st.recovery.started_empty.empty()) rec["started_empty"] = st.recovery.started_empty;
      o["arena_recovery"] = std::move(rec);
    }
    if (st.l2 != nullptr) {
      const L2Stats l = st.l2->stats();
      o["l2"] = json::object{{"connected", l.connected},         {"auth_refused", l.auth_refused},
                             {"redis_nodes", l.redis.nodes},
                             {"cluster", l.redis.cluster},       {"write_queue", l.queue},
                             {"written", l.written},             {"write_failed", l.write_failed},
                             {"write_dropped", l.write_dropped}, {"promoted", l.promoted},
                             {"lookups", l.lookups},             {"lookup_misses", l.lookup_misses},
                             {"bad_values", l.bad_values},       {"unanswered", l.unanswered},
                             {"bad_values_deleted", l.bad_values_deleted}, {"unauthenticated", l.unauthenticated},
                             {"error_replies", l.error_replies},
                             {"moved", l.redis.moved},           {"asked", l.redis.asked}};
    }
    if (st.disk != nullptr) {
      const DiskStats d = st.disk->stats();
      o["disk"] = json::object{{"files", d.files},
                               {"registered_buffers", d.registered_buffers},
                               {"capacity_bytes", d.capacity_bytes},
                               {"used_bytes", d.used_bytes},
                               {"objects", d.objects},
                               {"write_queue", d.queue},
                               {"in_flight", d.in_flight},
                               {"pinned", d.pinned},
                               {"written", d.written},
                               {"write_dropped", d.write_dropped},
                               {"write_errors", d.write_errors},
                               {"promoted", d.promoted},
                               {"read_errors", d.read_errors},
                               {"checksum_failures", d.checksum_failures},
                               {"lookups", d.lookups},
                               {"lookup_misses", d.lookup_misses},
                               {"timeouts", d.timeouts},
                               {"evictions", d.evictions},
                               {"recovered_objects", d.recovered_objects},
                               {"recovery_dropped", d.recovery_dropped},
                               {"recovery_seconds", d.recovery_seconds}};
    }
    return common::HttpResponse{200, "application/json", json::serialize(o)};
  };
  r["/debug/history"] = [st = state] {
    const auto now = TierHistory::Clock::now();
    st.service.history().tick(now, st.classes);
    return common::HttpResponse{200, "application/json", json::serialize(st.service.history().json(now))};
  };
  r["/metrics"] = [st = state] {
    const tier::Index::Stats t = st.classes.stats();
    common::PromText p;
    const std::string protocol = std::to_string(proto::kMajor) + "." + std::to_string(proto::kMinor);
    p.info("kvstrand_server_build_info", "This kvstrand-server's version and protocol",
           common::labels({{"version", KVSTRAND_VERSION_STRING}, {"protocol", protocol}}));
    p.counter("kvstrand_server_requests_total", "Requests answered, by type and status", st.requests);
    p.counter("kvstrand_server_evictions_total", "Objects evicted from the tier", t.evictions);
    p.counter("kvstrand_server_lookup_hits_total",
              "Chunks lookups hit, by the level each came from (arena, or disk or L2 that promoted it for the "
              "lookup) and the registration's tenant",
              st.service.lookup_hits());
    p.counter("kvstrand_server_lookup_misses_total",
              "Lookups that stopped short of their keys, by why the first missing chunk is missing",
              st.service.lookup_misses());
    p.counter("kvstrand_server_dropped_objects_total", "Objects of namespaces dropped (protocol drop) from the tier",
              t.dropped);
    p.counter("kvstrand_server_refused_full_total", "Chunks refused because the tier was full", t.refused_full);
    p.counter("kvstrand_server_holds_freed_at_exit_total", "Leases and reservations freed when their process exited",
              st.orphans_freed);
    p.counter("kvstrand_server_accept_errors_total",
              "accept() failures (out of descriptors or memory: the server backs off, 10 ms to 1 s)", st.accept.failures());
    p.gauge("kvstrand_server_sessions", "Client sessions open", static_cast<double>(st.sessions.size()));
    p.gauge("kvstrand_server_client_processes", "Client processes watched", static_cast<double>(st.processes.size()));
    p.gauge("kvstrand_server_leases", "Leases held", static_cast<double>(t.leases));
    p.gauge("kvstrand_server_reservations", "Reservations held", static_cast<double>(t.reservations));
    p.gauge("kvstrand_server_tier_configured_bytes", "Arena size (--tier-bytes)", static_cast<double>(st.arena.bytes()));
    if (st.segment_bytes != 0)
      p.gauge("kvstrand_server_tier_segment_bytes", "Tenants' segments beside the arena (--tenant-segment)",
              static_cast<double>(st.segment_bytes));
    p.gauge("kvstrand_server_tier_ready_bytes", "Arena and segment bytes populated so far",
            static_cast<double>(st.ready_bytes()));
    if (st.l2 != nullptr || st.disk != nullptr)
      p.gauge("kvstrand_server_tier_mapped_bytes",
              "Arena bytes the server's own mapping has faulted in (after the slabs are ready; L2 and the disk "
              "touch objects there)",
              static_cast<double>(std::uint64_t{st.mapped_slabs} * st.arena.slab_bytes()));
    p.gauge("kvstrand_server_tier_used_bytes", "Tier bytes in use", static_cast<double>(t.used_bytes));
    p.gauge("kvstrand_server_tier_objects", "Objects committed", static_cast<double>(t.objects));
    if (st.recovery.named) {
      p.counter("kvstrand_server_arena_recovered_objects_total",
                "Committed objects a restarted server found in its named arena (--arena-path)", st.recovery.objects);
      p.counter("kvstrand_server_arena_dropped_objects_total", "Objects of the named arena dropped at start, by reason",
                common::LabeledCounter{{"reason=\"uncommitted\"", st.recovery.dropped_uncommitted},
                                       {"reason=\"corrupt\"", st.recovery.dropped_corrupt}});
      p.gauge("kvstrand_server_arena_recovery_seconds", "Time the start spent reading the named arena's tables",
              st.recovery.seconds);
    }
    if (st.l2 != nullptr) {
      const L2Stats l = st.l2->stats();
      p.gauge("kvstrand_server_l2_connected", "1 once a Redis slot map was learned", l.connected ? 1 : 0);
      p.gauge("kvstrand_server_l2_auth_refused", "1 while Redis refuses the credentials (--l2-user, --l2-password-file)",
              l.auth_refused ? 1 : 0);
      p.counter("kvstrand_server_l2_written_total", "Objects written behind to L2", l.written);
      p.counter("kvstrand_server_l2_write_failed_total", "L2 writes that failed or got no answer", l.write_failed);
      p.counter("kvstrand_server_l2_write_dropped_total", "Objects not written to L2: the write queue was full",
                l.write_dropped);
      p.gauge("kvstrand_server_l2_write_queue", "Objects waiting to be written to L2", static_cast<double>(l.queue));
      p.counter("kvstrand_server_l2_promoted_total", "Chunks copied from L2 into the arena", l.promoted);
      p.counter("kvstrand_server_l2_lookups_total", "Lookups that asked L2 for chunks the arena lacked", l.lookups);
      p.counter("kvstrand_server_l2_lookup_misses_total", "Lookups L2 added nothing to", l.lookup_misses);
      p.counter("kvstrand_server_l2_bad_values_total", "L2 values refused (header, length or checksum)",
                l.bad_values);
      p.counter("kvstrand_server_l2_bad_values_deleted_total", "Refused L2 values deleted from Redis",
                l.bad_values_deleted);
      p.counter("kvstrand_server_l2_unauthenticated_total",
                "L2 values refused by their MAC, or for lacking one (--l2-mac-key-file); left in Redis",
                l.unauthenticated);
      p.counter("kvstrand_server_l2_error_replies_total",
                "L2 GETs Redis answered with an error (CLUSTERDOWN while a master rejoins, WRONGTYPE, ...)",
                l.error_replies);
      p.counter("kvstrand_server_l2_unanswered_total", "L2 reads with no answer within --l2-timeout", l.unanswered);
      p.counter("kvstrand_server_l2_purged_total", "L2 values deleted by namespace drops", l.purged);
      p.counter("kvstrand_server_l2_purge_failed_total",
                "Attempts of a namespace drop's purge that could not scan every master to its end (each retried)",
                l.purge_failed);
      p.counter("kvstrand_server_l2_purges_skipped_total",
                "Namespace drops whose namespace no node ever wrote to L2 (no marker): no scan", l.purges_skipped);
      p.gauge("kvstrand_server_l2_purges_pending", "Namespace drops whose L2 purge has not ended (not promoted until it has)",
              static_cast<double>(l.purges_pending));
      p.counter("kvstrand_server_l2_redirects_total", "MOVED and ASK redirections followed",
                l.redis.moved + l.redis.asked);
    }
    if (st.tenants != nullptr) {
      common::LabeledCounter bytes, quota, evicted;
      const auto each = [&](const tier::TenantBook& book, const char* level) {
        for (const tier::TenantBook::Tenant& t : book.all()) {
          const std::string l = common::labels({{"tenant", t.name}, {"level", level}});
          bytes[l] = t.used;
          evicted[l] = t.evicted;
          if (t.quota != tier::TenantBook::kNoQuota) quota[l] = t.quota;
        }
      };
      each(*st.tenants, "arena");
      if (st.disk != nullptr && st.disk->tenants() != nullptr) each(*st.disk->tenants(), "disk");
      p.gauge("kvstrand_server_tenant_bytes", "Bytes each tenant's objects take, by level", bytes);
      p.gauge("kvstrand_server_tenant_quota_bytes", "Each tenant's quota, by level (--tenant-quota)", quota);
      p.counter("kvstrand_server_tenant_evictions_total", "Objects of each tenant evicted, by level", evicted);
    }
    if (st.events != nullptr) {
      const EventStats e = st.events->publisher().stats();
      p.counter("kvstrand_server_events_total", "KV events published (--events), by type",
                common::LabeledCounter{{"type=\"BlockStored\"", e.stored},
                                       {"type=\"BlockRemoved\"", e.removed},
                                       {"type=\"AllBlocksCleared\"", e.cleared}});
      p.counter("kvstrand_server_event_batches_total", "KV event batches published (sequence numbers used)",
                e.batches);
      p.counter("kvstrand_server_event_replays_total", "KV event replay requests answered (--events-replay)",
                e.replays);
      p.counter("kvstrand_server_event_replays_refused_total",
                "KV event replays answered with the end marker alone (too many at once), or given up (the "
                "requester stopped reading)",
                e.replays_refused);
      p.gauge("kvstrand_server_event_buffer_bytes", "Bytes of the KV event batches kept for replay (--events-buffer-bytes)",
              static_cast<double>(e.kept_bytes));
      p.gauge("kvstrand_server_event_buffer_batches", "KV event batches kept for replay (--events-buffer)",
              static_cast<double>(e.kept));
      p.counter("kvstrand_server_event_descriptions_refused_total",
                "Chunk event descriptions refused as malformed: those objects are stored, never announced",
                st.events->refused());
      p.gauge("kvstrand_server_event_descriptions", "Distinct chunk event descriptions held (each once, however many objects "
              "of the arena and the disk carry it)", static_cast<double>(st.events->descriptions().size()));
      p.gauge("kvstrand_server_event_description_bytes", "Bytes of the chunk event descriptions held",
              static_cast<double>(st.events->descriptions().bytes()));
    }
    if (st.disk != nullptr) {
      const DiskStats d = st.disk->stats();
      p.gauge("kvstrand_server_disk_capacity_bytes", "Disk tier bytes in its extents, less the extent headers (each object also takes a 4 KiB header block)",
              static_cast<double>(d.capacity_bytes));
      p.gauge("kvstrand_server_disk_used_bytes", "Disk tier bytes holding objects", static_cast<double>(d.used_bytes));
      p.gauge("kvstrand_server_disk_objects", "Objects on disk", static_cast<double>(d.objects));
      p.gauge("kvstrand_server_disk_registered_buffers", "1 when the disk I/O uses io_uring registered buffers",
              d.registered_buffers ? 1 : 0);
      p.gauge("kvstrand_server_disk_write_queue", "Objects waiting to be written to disk", static_cast<double>(d.queue));
      p.gauge("kvstrand_server_disk_in_flight", "Objects being read or written", static_cast<double>(d.in_flight));
      p.gauge("kvstrand_server_disk_pinned", "Disk objects held by promotions into the arena (0 at rest: one held for good can never be evicted)",
              static_cast<double>(d.pinned));
      p.counter("kvstrand_server_disk_written_total", "Objects written behind to disk", d.written);
      p.counter("kvstrand_server_disk_written_bytes_total", "Object bytes written behind to disk", d.written_bytes);
      p.counter("kvstrand_server_disk_write_dropped_total",
                "Objects not written to disk: the queue (--disk-queue) was full", d.write_dropped);
      p.counter("kvstrand_server_disk_promoted_total", "Objects read from disk into the arena", d.promoted);
      p.counter("kvstrand_server_disk_read_bytes_total", "Object bytes read from disk into the arena", d.read_bytes);
      p.counter("kvstrand_server_disk_errors_total", "Disk reads and writes that failed (EIO, ENOSPC, short)",
                common::LabeledCounter{{"op=\"read\"", d.read_errors}, {"op=\"write\"", d.write_errors}});
      p.counter("kvstrand_server_disk_checksum_failures_total",
                "Disk objects whose header or bytes did not match: a miss, dropped", d.checksum_failures);
      p.counter("kvstrand_server_disk_lookups_total", "Lookups that asked the disk for chunks the arena lacked",
                d.lookups);
      p.counter("kvstrand_server_disk_lookup_misses_total", "Lookups the disk added nothing to", d.lookup_misses);
      p.counter("kvstrand_server_disk_timeouts_total",
                "Lookups answered at --disk-timeout with disk reads still running", d.timeouts);
      p.counter("kvstrand_server_disk_evictions_total", "Objects evicted from the disk", d.evictions);
      p.counter("kvstrand_server_disk_recovered_objects_total", "Objects a starting server found on its disk",
                d.recovered_objects);
      p.counter("kvstrand_server_disk_recovery_dropped_total",
                "Slot or extent headers a starting server found torn or of another geometry", d.recovery_dropped);
    }
    return common::HttpResponse{200, "text/plain; version=0.0.4", p.str()};
  };
  common::add_debug_page(r, "kvstrand-server " + state.socket, {"/debug/tier", "/debug/sessions", "/debug/holds"},
                         debug_summary_script());
  return r;
}

}  // namespace kvstrand::server
