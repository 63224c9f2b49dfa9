// What a Connector counts and shows on its debug endpoint: the counters and
// histograms its strand keeps (no locks: only the strand touches them), the
// step thread's time inside kvstrand calls (written by the engine thread),
// and their JSON and Prometheus renderings.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <kvstrand/errors.hpp>

#include "device/event_pool.hpp"
#include "device/load_path.hpp"
#include "tier/index.hpp"
#include "common/metrics.hpp"
#include "reactor/poller.hpp"
#include "connector/transfer.hpp"

namespace kvstrand::connector {

using common::AtomicHistogram;
using common::Histogram;
using common::PromText;
using common::labels;
using common::LabeledCounter;

struct TransferInfo;

// On the strand. Each end and each answer is counted by index (no label
// string made, no map searched: a load's end is on its latency path,
// bench_transfer --trace); the labelled views are made when rendered.
struct ConnectorMetrics {
  // "ok", each TransferErrc by its value, "other" last.
  static constexpr std::size_t kOutcomes = static_cast<std::size_t>(kvstrand::TransferErrc::blocks_in_use) + 2;
  std::array<std::array<std::uint64_t, kOutcomes>, 2> ended{};  // [kind][outcome]
  std::array<std::uint64_t, 2> bytes_moved{};                   // [kind], transfers that completed
  std::array<std::uint64_t, 3> answered{};                      // lookups: hit (every key), partial, miss
  std::uint64_t fail_stops = 0;
  Histogram load_seconds, save_seconds, producer_wait_seconds;

  void transfer_ended(TransferKind kind, std::error_code ec, std::uint64_t bytes, double seconds);
  void lookup_answered(std::size_t keys, std::size_t chunks_hit);
  // The labelled views (those counted at least once).
  LabeledCounter transfers() const;  // kind, outcome
  LabeledCounter bytes() const;      // kind
  LabeledCounter lookups() const;    // result
};

// The short label of a transfer's ending: "ok" or the TransferErrc's name.
std::string_view outcome_label(std::error_code ec);

std::string transfers_json(const std::vector<TransferInfo>& live, std::string_view tier);
std::string events_json(const device::EventPool::Stats& events, const reactor::PollerStats& poller);
std::string tier_json(std::string_view kind, const tier::Index::Stats& tier, const ConnectorMetrics& m);
// What the process's loads follow (device/load_path.hpp): null is the
// backend's built-in rule.
std::string load_path_json(const device::LoadPaths* paths);
std::string prometheus(const ConnectorMetrics& m, const Histogram& step_calls, const tier::Index::Stats& tier,
                       const device::EventPool::Stats& events, std::size_t live_transfers);

}  // namespace kvstrand::connector
