// What a Connector counts on its strand (ConnectorMetrics): each end under
// its kind and outcome, bytes for those that completed, lookups by result;
// and the labelled views its /metrics and /debug/tier render.
#include <catch2/catch.hpp>

#include <system_error>

#include "connector/connector_metrics.hpp"

using namespace kvstrand;
using connector::ConnectorMetrics;

TEST_CASE("connector metrics: each end counted under its kind and outcome, bytes only for the completed",
          "[connector]") {
  ConnectorMetrics m;
  m.transfer_ended(TransferKind::save, {}, 100, 0.001);
  m.transfer_ended(TransferKind::save, {}, 50, 0.001);
  m.transfer_ended(TransferKind::load, make_error_code(TransferErrc::deadline_exceeded), 999, 0.001);
  m.transfer_ended(TransferKind::load, make_error_code(TransferErrc::blocks_in_use), 999, 0.001);
  m.transfer_ended(TransferKind::load, make_error_code(TransferErrc::duplicate_transfer), 999, 0.001);
  m.transfer_ended(TransferKind::load, std::make_error_code(std::errc::operation_canceled), 999, 0.001);
  const auto t = m.transfers();
  CHECK(t.size() == 5);
  CHECK(t.at(R"(kind="save",outcome="ok")") == 2);
  CHECK(t.at(R"(kind="load",outcome="deadline_exceeded")") == 1);
  CHECK(t.at(R"(kind="load",outcome="blocks_in_use")") == 1);
  CHECK(t.at(R"(kind="load",outcome="duplicate_transfer")") == 1);
  CHECK(t.at(R"(kind="load",outcome="other")") == 1);
  // Bytes of the saves that completed; no load completed, so no load entry.
  const auto b = m.bytes();
  CHECK(b.size() == 1);
  CHECK(b.at(R"(kind="save")") == 150);
  CHECK(m.save_seconds.count == 2);
  CHECK(m.load_seconds.count == 0);
}

TEST_CASE("connector metrics: lookups counted by result, only those seen", "[connector]") {
  ConnectorMetrics m;
  CHECK(m.lookups().empty());
  m.lookup_answered(4, 4);
  m.lookup_answered(4, 5);  // more than asked is still every key
  m.lookup_answered(4, 1);
  m.lookup_answered(4, 0);
  m.lookup_answered(4, 0);
  const auto l = m.lookups();
  CHECK(l.at(R"(result="hit")") == 2);
  CHECK(l.at(R"(result="partial")") == 1);
  CHECK(l.at(R"(result="miss")") == 2);
}
