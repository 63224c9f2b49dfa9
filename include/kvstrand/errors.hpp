// Errors that cross the engine boundary: typed, and saying what to do.
// (Also kvstrand::kv::ConfigError, in layout.hpp: an option or layout refused
// at start-up, naming it.)
#pragma once

#include <stdexcept>
#include <string>
#include <system_error>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand {

enum class TransferErrc {
  duplicate_transfer = 1,  // a save (or load) of this request is still live
  not_registered,          // register_layout() first
  bad_spec,                // the call's arguments do not fit (a spec, a registration, a lease hand-off)
  closed,                  // the connector was closed
  deadline_exceeded,       // fail-stop: the transfer passed its deadline
  fence_timeout,           // fail-stop: a fence timed out
  tier_full,               // the tier could not make room for a chunk
  missing_chunk,           // a load named a chunk the tier does not hold
  device_error,            // a copy failed on the device
  tier_unavailable,        // the tier server cannot be reached (the transfer did not happen)
  too_many_live,           // max_live_transfers / max_live_lookups would be passed: drain finished() first
  blocks_in_use,           // a live load writes, or a live save reads, a block this transfer names
};

const std::error_category& transfer_category() noexcept;
std::error_code make_error_code(TransferErrc e) noexcept;

// Raised by finished() and fence() once the reactor cannot vouch for device
// memory any more (a deadline passed: a DMA may still be running). It is
// raised on every later call, never once and then silence.
class FailStop : public std::system_error {
 public:
  FailStop(std::error_code ec, const std::string& what)
      : std::system_error(ec, what + ". kvstrand cannot prove that no transfer still touches device memory: "
                                     "stop the engine and restart the process; do not reuse the blocks") {}
};

// Raised synchronously by save()/load()/register_layout() for a request the
// connector refuses; nothing was posted.
class TransferRefused : public std::system_error {
 public:
  TransferRefused(std::error_code ec, const std::string& what) : std::system_error(ec, what) {}
};

}  // namespace kvstrand
#pragma GCC visibility pop

template <>
struct std::is_error_code_enum<kvstrand::TransferErrc> : std::true_type {};
