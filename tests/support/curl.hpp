// HTTP GETs with curl and a free loopback port (common/free_port.hpp), for the tests that read a
// debug endpoint (the Connector's or kvstrand-server's).
#pragma once

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/free_port.hpp"
#include "process.hpp"

namespace kvstrand::test {

struct Got {
  int code = 0;
  std::string body;
};

// GET (or another method) with curl; code 0 when curl itself failed.
// `header`: one more request header ("Authorization: Bearer ...").
inline Got curl(std::uint16_t port, const std::string& path, const std::string& method = "GET",
                const std::string& header = "") {
  std::vector<std::string> args = {"/usr/bin/curl", "-s", "-m", "10", "-X", method, "-w", "\n%{http_code}"};
  if (!header.empty()) args.insert(args.end(), {"-H", header});
  args.push_back("http://127.0.0.1:" + std::to_string(port) + path);
  auto r = run_process(args);
  Got g;
  const auto nl = r.output.rfind('\n');
  if (r.exit_code != 0 || nl == std::string::npos) return g;
  g.code = std::atoi(r.output.c_str() + nl + 1);
  g.body = r.output.substr(0, nl);
  return g;
}

inline bool have(const char* tool) { return std::filesystem::exists(tool); }

// curl drives every case; a machine without it skips them, saying so.
inline bool curl_present() {
  if (have("/usr/bin/curl")) return true;
  WARN("skipped: /usr/bin/curl missing (scripts/bootstrap.sh --test installs it)");
  return false;
}

// promtool's verdict on a scrape ("" when it accepts it).
inline std::string promtool_check(const std::string& metrics) {
  const auto file = std::filesystem::temp_directory_path() / ("kvstrand-metrics-" + std::to_string(::getpid()));
  std::ofstream(file) << metrics;
  auto r = run_process({"/bin/sh", "-c", "/usr/bin/promtool check metrics < " + file.string()});
  std::filesystem::remove(file);
  return r.exit_code == 0 ? "" : "promtool: " + r.output;
}

using common::free_port;

}  // namespace kvstrand::test
