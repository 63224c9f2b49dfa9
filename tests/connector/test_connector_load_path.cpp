// The Connector's load_path option (ConnectorOptions::load_path): measured
// at registration on a sim host where one path is slow, loads follow the
// choice byte for byte, the debug endpoint and the metrics say what was
// chosen; a forced path is followed; the default (the rule) measures
// nothing; an unknown word is refused by name.
// The choice itself: tests/device/test_load_path.cpp.
#include <boost/json.hpp>

#include "connector_rig.hpp"
#include "curl.hpp"
#include "device/load_path.hpp"
#include "load_path_reset.hpp"

using namespace kvstrand;
using namespace kvstrand::test;
using namespace std::chrono_literals;
using device::LoadPath;

namespace {

std::pair<std::uint64_t, std::uint64_t> batches() {
  return {device::sim::batches_by(LoadPath::kernel), device::sim::batches_by(LoadPath::dma_batch)};
}

}  // namespace

TEST_CASE("connector: load_path=measure on a host whose copy engines are slow for small segments: a registration "
          "probes its 2 KiB blocks, their loads go by the kernel, byte for byte, and /debug/load-path and /metrics "
          "say so",
          "[reactor][load_path][http]") {
  if (!device_present() || !sim_hooks_present() || !curl_present()) return;
  LoadPathReset reset;
  device::forget_load_paths();
  // 5 us a segment, and 2 ms a MiB, so that the copy engines lose every
  // class however slow the host's own copies run: once, in a loaded TSan
  // suite, the load went by them (the load's adjacent blocks coalesce into
  // 4-8 KiB runs, classes the probe times on this host's memmove).
  require_ok(device::sim::set_load_path_cost(LoadPath::dma_batch, 5us, 2ms));
  connector::ConnectorOptions o;
  o.load_path = "measure";
  o.http = common::HttpOptions{};
  Rig rig(o);  // its registration measures here, once for the process
  REQUIRE(device::load_paths() != nullptr);
  REQUIRE(device::load_paths()->path_for(Rig::kPlaneBlockBytes) == LoadPath::kernel);
  const auto [kernel, dma] = batches();
  rig.round_trip();  // its load's blocks are scattered: a batch of 2 KiB segments
  CHECK(batches().first > kernel);
  CHECK(batches().second == dma);

  const auto port = rig.conn->http_port();
  const auto got = curl(port, "/debug/load-path");
  REQUIRE(got.code == 200);
  const auto j = boost::json::parse(got.body).as_object();
  CHECK(std::string(j.at("how").as_string()).rfind("measured on device 0 in ", 0) == 0);
  const auto& classes = j.at("classes").as_array();
  REQUIRE(classes.size() == 13);  // 4 KiB to 4 MiB, and the Rig's own: 512 B images, 2 KiB blocks
  CHECK(classes[0].as_object().at("segment_bytes").as_int64() == 512);
  CHECK(classes[1].as_object().at("segment_bytes").as_int64() == 2048);
  CHECK(classes[1].as_object().at("chosen").as_string() == "kernel");
  CHECK(classes[1].as_object().at("kernel_gbps").as_double() > classes[1].as_object().at("dma_batch_gbps").as_double());
  const std::string metrics = curl(port, "/metrics").body;
  CHECK(metrics.find("kvstrand_load_path_chosen{segment_bytes=\"4096\",path=\"kernel\"} 1\n") != std::string::npos);
  CHECK(metrics.find("kvstrand_load_path_chosen{segment_bytes=\"4096\",path=\"dma-batch\"} 0\n") != std::string::npos);
  CHECK(metrics.find("kvstrand_load_path_probe_bytes_per_second{segment_bytes=\"4194304\",path=\"kernel\"}") !=
        std::string::npos);
  if (have("/usr/bin/promtool")) CHECK(promtool_check(metrics).empty());
}

TEST_CASE("connector: load_path=dma-batch sends every load to the copy engines, byte for byte, the default measures "
          "nothing, and an unknown word is refused naming the option",
          "[reactor][load_path]") {
  if (!device_present() || !sim_hooks_present()) return;
  LoadPathReset reset;
  connector::ConnectorOptions o;
  o.load_path = "dma-batch";
  Rig rig(o);
  REQUIRE(device::load_paths() != nullptr);
  CHECK(device::load_paths()->how == "load_path=dma-batch");
  const auto [kernel, dma] = batches();
  rig.round_trip();
  CHECK(batches().first == kernel);
  CHECK(batches().second > dma);

  // The default is the built-in rule: nothing measured, whatever the host.
  {
    LoadPathReset again;
    // 5 us a segment, and 2 ms a MiB, so that the copy engines lose every
  // class however slow the host's own copies run: once, in a loaded TSan
  // suite, the load went by them (the load's adjacent blocks coalesce into
  // 4-8 KiB runs, classes the probe times on this host's memmove).
  require_ok(device::sim::set_load_path_cost(LoadPath::dma_batch, 5us, 2ms));
    Rig plain;
    CHECK(device::load_paths() == nullptr);
  }
  connector::ConnectorOptions bad;
  bad.load_path = "fastest";
  try {
    connector::Connector c(bad);
    FAIL("load_path=fastest was accepted");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("load_path") != std::string::npos);
    CHECK(std::string(e.what()).find("rule, measure, kernel or dma-batch") != std::string::npos);
  }
}
