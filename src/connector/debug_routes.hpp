// A Connector's debug endpoint: /healthz, /metrics, /debug and its JSON
// views. The routes run on the strand, so they read the transfer table
// directly; `step_calls` is the engine thread's time inside kvstrand calls.
#pragma once

#include <memory>

#include "common/debug_http.hpp"
#include "common/metrics.hpp"
#include "connector/transfer_table.hpp"

namespace kvstrand::connector {

common::HttpRoutes debug_routes(std::shared_ptr<TransferTable> table,
                                std::shared_ptr<common::AtomicHistogram> step_calls);

}  // namespace kvstrand::connector
