#include "connector/debug_routes.hpp"

#include "common/debug_page.hpp"
#include "connector/connector_metrics.hpp"

namespace kvstrand::connector {

using common::HttpResponse;

common::HttpRoutes debug_routes(std::shared_ptr<TransferTable> table,
                                std::shared_ptr<common::AtomicHistogram> step_calls) {
  common::HttpRoutes routes;
  reactor::Reactor* r = &table->reactor();
  routes["/healthz"] = [table] {
    if (!table->failed()) return HttpResponse{200, "text/plain", "ok\n"};
    return HttpResponse{503, "text/plain", "fail-stop: " + table->fail_stop() + "\n"};
  };
  routes["/debug/transfers"] = [table] {
    return HttpResponse{200, "application/json", transfers_json(table->snapshot(), table->tier().index().kind())};
  };
  routes["/debug/events"] = [r] {
    return HttpResponse{200, "application/json", events_json(r->events().stats(), r->poller().stats())};
  };
  routes["/debug/tier"] = [table] {
    return HttpResponse{200, "application/json", tier_json(table->tier().index().kind(), table->tier().index().stats(), table->metrics())};
  };
  routes["/debug/load-path"] = [] {
    return HttpResponse{200, "application/json", load_path_json(device::load_paths())};
  };
  routes["/metrics"] = [table, r, steps = std::move(step_calls)] {
    return HttpResponse{200, "text/plain; version=0.0.4",
                        prometheus(table->metrics(), steps->snapshot(), table->tier().index().stats(), r->events().stats(),
                                   table->live_count())};
  };
  common::add_debug_page(routes, "kvstrand connector", {"/debug/transfers", "/debug/events", "/debug/tier", "/debug/load-path"});
  return routes;
}

}  // namespace kvstrand::connector
