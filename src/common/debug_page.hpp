// The /debug page: one HTML document that shows /healthz and the JSON
// endpoints it is given as tables, rendered here on each request (so a page
// read without scripts, or before they run, shows the state as it is) and
// refreshed by its script every two seconds; sizes in B to TiB. The same
// page serves a Connector's endpoint and kvstrand-server's (which adds a
// summary: server/debug_summary). Self-contained: it loads nothing else.
#pragma once

#include <string>
#include <vector>

#include "common/debug_http.hpp"

namespace kvstrand::common {

// Adds "/debug" to `routes`: the page over `json_endpoints` (each already a
// route) and "/healthz" (a route too, where there is one). Routes run on the
// strand, so the page calls them directly. `summary_script`: JavaScript
// defining `async function summary(data)` (data: each endpoint's JSON by
// path), called after every refresh to fill the page's summary box
// (#summary) above the tables; none: no box.
void add_debug_page(HttpRoutes& routes, const std::string& title, const std::vector<std::string>& json_endpoints,
                    const std::string& summary_script = {});

// How the page writes a count of bytes (a value whose key ends in "bytes"):
// "512 B", "1.5 KiB", "40 GiB", with at most three significant digits.
std::string page_bytes(double v);

// How the page writes a number: integers as they are, others with at most
// two decimals ("1.78", "21715.73", "0.5").
std::string page_number(double v);

}  // namespace kvstrand::common
