// The /debug page: one HTML document that shows /healthz and the JSON
// endpoints it is given as tables, rendered here on each request (so a page
// read without scripts, or before they run, shows the state as it is) and
// refreshed by its script every two seconds. The same page serves a
// Connector's endpoint and kvstrand-server's.
#pragma once

#include <string>
#include <vector>

#include "common/debug_http.hpp"

namespace kvstrand::common {

// Adds "/debug" to `routes`: the page over `json_endpoints` (each already a
// route) and "/healthz" (a route too, where there is one). Routes run on the
// strand, so the page calls them directly.
void add_debug_page(HttpRoutes& routes, const std::string& title, const std::vector<std::string>& json_endpoints);

// How the page writes a number: integers as they are, others with at most
// two decimals ("1.78", "21715.73", "0.5").
std::string page_number(double v);

}  // namespace kvstrand::common
