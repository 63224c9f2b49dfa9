// One save or load, owned by the reactor strand from post to terminal.
//
// queued -> waiting_producer -> submitted -> pending -> terminal (done/failed)
// Only the strand reads or writes a Transfer. Its deadline is its own (its
// start plus the one transfer_deadline): nothing another transfer does can
// delay it. An ended Transfer may be reused for a later start
// (TransferTable::keep_ended).
#pragma once

#include <atomic>
#include <chrono>
#include <compare>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <system_error>

#include "device/event.hpp"
#include <kvstrand/finished.hpp>
#include <kvstrand/transfer_spec.hpp>

namespace kvstrand::connector {

using kvstrand::TransferKind;
using kvstrand::to_string;
// A transfer as the engine names it: at most one of each kind per request
// and registration is live.
struct TransferKey {
  std::string request;
  TransferKind kind = TransferKind::save;
  std::uint32_t registration = 0;
  friend auto operator<=>(const TransferKey&, const TransferKey&) = default;
};
// The same, borrowing the request's name: a lookup that copies nothing.
struct TransferKeyView {
  std::string_view request;
  TransferKind kind = TransferKind::save;
  std::uint32_t registration = 0;
  TransferKeyView(std::string_view r, TransferKind k, std::uint32_t g) : request(r), kind(k), registration(g) {}
  TransferKeyView(const TransferKey& k) : request(k.request), kind(k.kind), registration(k.registration) {}
  friend auto operator<=>(const TransferKeyView&, const TransferKeyView&) = default;
};
// Hashes and compares keys and views together (an unordered map's
// transparent hash and equality).
struct TransferKeyHash {
  using is_transparent = void;
  std::size_t operator()(TransferKeyView k) const noexcept {
    return std::hash<std::string_view>{}(k.request) ^
           (std::size_t{k.registration} << 1 | static_cast<std::size_t>(k.kind)) * 0x9e3779b97f4a7c15ull;
  }
};
struct TransferKeyEqual {
  using is_transparent = void;
  bool operator()(TransferKeyView a, TransferKeyView b) const noexcept { return a == b; }
};

// Orders keys and views together (a map's transparent comparator).
struct TransferKeyLess {
  using is_transparent = void;
  bool operator()(TransferKeyView a, TransferKeyView b) const noexcept { return a < b; }
};

enum class TransferState { queued, waiting_producer, submitted, pending, done, failed };

const char* to_string(TransferState s) noexcept;

struct Transfer {
  using Clock = std::chrono::steady_clock;

  std::uint64_t id = 0;
  TransferKind kind = TransferKind::save;
  // Its own spec, unpacked from what submit() packed into the ring's slot:
  // the strand never reads the engine's spec, so a transfer kept past its
  // end (stuck) still has what it names.
  kv::TransferSpec spec;
  // The engine's spec (Connector's live entry), named in the transfer's end
  // so that the engine's thread finds its entry; never read here.
  const kv::TransferSpec* engine_spec = nullptr;
  // The engine's event after the last forward touching these blocks; held
  // until it is seen complete (Connector's producer contract).
  std::shared_ptr<const device::Event> producer;
  // A load: recorded after its copies once they are queued, then named in
  // `queued_notice` (Connector::order_after_load waits on it). Lent by the
  // strand's QueuedEvents, given back with the transfer's end.
  device::Event* queued_event = nullptr;
  // The engine's live entry's (Connector::Uses::queued): the one word of
  // the engine's memory the strand writes, once, before the end; the entry
  // outlives it (dropped only once the end is drained).
  std::atomic<const device::Event*>* queued_notice = nullptr;
  TransferState state = TransferState::queued;
  Clock::time_point posted{};
  Clock::time_point deadline{};
  std::error_code error;
  std::string reason;

  bool terminal() const noexcept { return state == TransferState::done || state == TransferState::failed; }
};

}  // namespace kvstrand::connector
