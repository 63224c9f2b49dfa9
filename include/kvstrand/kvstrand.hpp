// Everything an engine includes: the Connector, the planner, chunk keys and
// the device helpers.
#pragma once

#include <kvstrand/block_leases.hpp>
#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/committed_blocks.hpp>
#include <kvstrand/connector.hpp>
#include <kvstrand/device_memory.hpp>
#include <kvstrand/errors.hpp>
#include <kvstrand/finished.hpp>
#include <kvstrand/hit_plan.hpp>
#include <kvstrand/layout.hpp>
#include <kvstrand/load_outcome.hpp>
#include <kvstrand/namespace_id.hpp>
#include <kvstrand/registration.hpp>
#include <kvstrand/save_tracker.hpp>
#include <kvstrand/sim.hpp>
#include <kvstrand/transfer_spec.hpp>
#include <kvstrand/version.hpp>
