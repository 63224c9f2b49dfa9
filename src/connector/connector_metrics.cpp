#include "connector/connector_metrics.hpp"

#include <boost/json.hpp>

#include <kvstrand/version.hpp>

#include "device/backend.hpp"
#include "connector/connector.hpp"
#include "index_plane/transfer_error.hpp"

namespace kvstrand::connector {

namespace json = boost::json;

std::string_view outcome_label(std::error_code ec) {
  if (!ec) return "ok";
  if (ec.category() != transfer_category()) return "other";
  switch (static_cast<TransferErrc>(ec.value())) {
    case TransferErrc::duplicate_transfer: return "duplicate_transfer";
    case TransferErrc::not_registered: return "not_registered";
    case TransferErrc::bad_spec: return "bad_spec";
    case TransferErrc::closed: return "closed";
    case TransferErrc::deadline_exceeded: return "deadline_exceeded";
    case TransferErrc::fence_timeout: return "fence_timeout";
    case TransferErrc::tier_full: return "tier_full";
    case TransferErrc::missing_chunk: return "missing_chunk";
    case TransferErrc::device_error: return "device_error";
    case TransferErrc::tier_unavailable: return "tier_unavailable";
    case TransferErrc::too_many_live: return "too_many_live";
    case TransferErrc::blocks_in_use: return "blocks_in_use";
  }
  return "other";
}

namespace {
constexpr std::size_t kOther = ConnectorMetrics::kOutcomes - 1;
constexpr std::array<const char*, 3> kResults = {"hit", "partial", "miss"};

std::size_t outcome_index(std::error_code ec) {
  if (!ec) return 0;
  if (ec.category() != transfer_category() || ec.value() <= 0 || static_cast<std::size_t>(ec.value()) >= kOther)
    return kOther;
  return static_cast<std::size_t>(ec.value());
}

// 0 is no error: outcome_label's "ok".
std::string_view outcome_at(std::size_t i) {
  return i == kOther ? "other" : outcome_label(static_cast<TransferErrc>(i));
}

std::size_t kind_index(TransferKind k) { return k == TransferKind::load ? 1 : 0; }
}  // namespace

void ConnectorMetrics::transfer_ended(TransferKind kind, std::error_code ec, std::uint64_t n, double seconds) {
  ++ended[kind_index(kind)][outcome_index(ec)];
  if (ec) return;
  bytes_moved[kind_index(kind)] += n;
  (kind == TransferKind::load ? load_seconds : save_seconds).observe(seconds);
}

void ConnectorMetrics::lookup_answered(std::size_t keys, std::size_t chunks_hit) {
  ++answered[chunks_hit == 0 ? 2 : chunks_hit >= keys ? 0 : 1];
}

LabeledCounter ConnectorMetrics::transfers() const {
  LabeledCounter out;
  for (TransferKind k : {TransferKind::save, TransferKind::load})
    for (std::size_t o = 0; o < kOutcomes; ++o)
      if (const std::uint64_t n = ended[kind_index(k)][o]; n != 0)
        out[labels({{"kind", to_string(k)}, {"outcome", outcome_at(o)}})] = n;
  return out;
}

LabeledCounter ConnectorMetrics::bytes() const {
  LabeledCounter out;
  for (TransferKind k : {TransferKind::save, TransferKind::load})
    if (ended[kind_index(k)][0] != 0) out[labels({{"kind", to_string(k)}})] = bytes_moved[kind_index(k)];
  return out;
}

LabeledCounter ConnectorMetrics::lookups() const {
  LabeledCounter out;
  for (std::size_t r = 0; r < kResults.size(); ++r)
    if (answered[r] != 0) out[labels({{"result", kResults[r]}})] = answered[r];
  return out;
}

std::string transfers_json(const std::vector<TransferInfo>& live, std::string_view tier) {
  json::array a;
  for (const auto& t : live)
    a.push_back(json::object{{"id", t.id},
                             {"request", t.request},
                             {"kind", to_string(t.kind)},
                             {"state", to_string(t.state)},
                             {"age_ms", static_cast<double>(t.age.count()) / 1e3},
                             {"deadline_left_ms", static_cast<double>(t.deadline_left.count()) / 1e3},
                             {"bytes", t.bytes},
                             {"tier", tier},
                             {"past_deadline", t.past_deadline}});
  return json::serialize(a);
}

std::string events_json(const device::EventPool::Stats& e, const reactor::PollerStats& p) {
  json::object o{{"live", e.live},
                 {"in_use", e.in_use},
                 {"idle", e.idle},
                 {"retiring", e.retiring},
                 {"created_since_start", e.created},
                 {"destroyed", e.destroyed},
                 {"acquired", e.acquired},
                 {"reused", e.reused},
                 {"records", e.records},
                 {"records_per_event", e.created ? static_cast<double>(e.records) / static_cast<double>(e.created) : 0.0},
                 {"max_records_one_event", e.max_records_one},
                 {"poller", json::object{{"outstanding", p.outstanding},
                                         {"max_outstanding", p.max_outstanding},
                                         {"completed", p.completed},
                                         {"failed", p.failed},
                                         {"ticks", p.ticks}}}};
  return json::serialize(o);
}

// `kind="save",outcome="ok"` -> `save/ok`: the label values, for JSON keys.
static std::string label_values(const std::string& l) {
  std::string out;
  bool in = false;
  for (char c : l) {
    if (c == '"') {
      in = !in;
      if (!in) out += '/';
    } else if (in) {
      out += c;
    }
  }
  if (!out.empty()) out.pop_back();
  return out;
}

std::string tier_json(std::string_view kind, const tier::Index::Stats& t, const ConnectorMetrics& m) {
  json::object lookups, transfers;
  for (const auto& [l, v] : m.lookups()) lookups[label_values(l)] = v;
  for (const auto& [l, v] : m.transfers()) transfers[label_values(l)] = v;
  json::object o{{"kind", kind},
                 {"capacity_bytes", t.capacity_bytes},
                 {"used_bytes", t.used_bytes},
                 {"objects", t.objects},
                 {"locked_objects", t.pinned},
                 {"writing", t.writing},
                 {"evictions", t.evictions},
                 {"refused_full", t.refused_full},
                 {"lookups_by_result", lookups},
                 {"transfers_by_outcome", transfers}};
  if (kind == "node") o["note"] = "the server's own /debug/tier shows its store";
  return json::serialize(o);
}

std::string load_path_json(const device::LoadPaths* paths) {
  if (!paths) return json::serialize(json::object{{"how", "the built-in rule"}, {"rule", device::backend::fastest_batch_path()}});
  json::array classes;
  for (const device::LoadPathClass& c : paths->classes)
    classes.push_back(json::object{{"segment_bytes", c.segment_bytes},
                                   {"kernel_gbps", c.kernel_gbps},
                                   {"dma_batch_gbps", c.dma_batch_gbps},
                                   {"chosen", device::to_string(c.chosen)}});
  return json::serialize(json::object{{"how", paths->how}, {"classes", classes}});
}

std::string prometheus(const ConnectorMetrics& m, const Histogram& step_calls, const tier::Index::Stats& tier,
                       const device::EventPool::Stats& events, std::size_t live_transfers) {
  PromText p;
  p.info("kvstrand_build_info", "This library's version and device backend",
         labels({{"version", KVSTRAND_VERSION_STRING}, {"backend", device::backend::name()}}));
  p.counter("kvstrand_transfers_total", "Transfers that ended, by kind and outcome", m.transfers());
  p.counter("kvstrand_transfer_bytes_total", "Bytes moved by transfers that completed, by kind", m.bytes());
  p.counter("kvstrand_lookups_total", "Tier lookups by result (hit: every key, partial, miss)", m.lookups());
  p.counter("kvstrand_fail_stops_total", "Fail-stop errors set (0 or 1 per connector)", m.fail_stops);
  p.counter("kvstrand_tier_evictions_total", "Objects the embedded tier evicted", tier.evictions);
  p.gauge("kvstrand_transfers_live", "Transfers not yet terminal", static_cast<double>(live_transfers));
  p.gauge("kvstrand_tier_used_bytes", "Bytes of the embedded tier in use", static_cast<double>(tier.used_bytes));
  p.gauge("kvstrand_tier_objects", "Objects committed in the embedded tier", static_cast<double>(tier.objects));
  p.gauge("kvstrand_events_live", "Device events the pool holds", static_cast<double>(events.live));
  if (const device::LoadPaths* paths = device::load_paths()) {
    LabeledCounter rate, chosen;
    for (const device::LoadPathClass& c : paths->classes) {
      const std::string size = std::to_string(c.segment_bytes);
      for (const device::LoadPath path : {device::LoadPath::kernel, device::LoadPath::dma_batch}) {
        const std::string l = labels({{"segment_bytes", size}, {"path", device::to_string(path)}});
        const double gbps = path == device::LoadPath::kernel ? c.kernel_gbps : c.dma_batch_gbps;
        rate[l] = static_cast<std::uint64_t>(gbps * 1e9);
        chosen[l] = c.chosen == path ? 1 : 0;
      }
    }
    p.gauge("kvstrand_load_path_probe_bytes_per_second",
            "A load path's rate per segment size, as measured at start (0: not measured, or not available)", rate);
    p.gauge("kvstrand_load_path_chosen", "1 for the path loads of that segment size take", chosen);
  }
  p.histogram("kvstrand_load_seconds", "Load latency, posted to completion", m.load_seconds);
  p.histogram("kvstrand_save_seconds", "Save latency, posted to completion", m.save_seconds);
  p.histogram("kvstrand_producer_wait_seconds", "Time transfers waited for the engine's producer event",
              m.producer_wait_seconds);
  p.histogram("kvstrand_step_call_seconds",
              "Step-thread time inside kvstrand calls (a finished() with nothing to drain, one atomic load, is not "
              "timed)",
              step_calls);
  return p.str();
}

}  // namespace kvstrand::connector
