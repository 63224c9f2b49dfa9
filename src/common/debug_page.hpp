// The /debug page: one HTML document that fetches the JSON endpoints it is
// given and /healthz every two seconds and renders them as tables. The same
// page serves a Connector's endpoint and kvstrand-server's.
#pragma once

#include <string>
#include <vector>

namespace kvstrand::common {

std::string debug_page(const std::string& title, const std::vector<std::string>& json_endpoints);

}  // namespace kvstrand::common
