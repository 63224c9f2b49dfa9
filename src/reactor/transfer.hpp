// One save or load, owned by the reactor strand from post to terminal.
//
// queued -> waiting_producer -> submitted -> pending -> terminal (done/failed)
// Only the strand reads or writes a Transfer. Its deadline is its own: a
// timer per transfer, so nothing another transfer does can delay it.
#pragma once

#include <chrono>
#include <compare>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "hip/event.hpp"
#include <kvstrand/finished.hpp>
#include <kvstrand/transfer_spec.hpp>

namespace kvstrand::reactor {

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
  // The engine's spec, in its thread's memory (Connector's live entry): this
  // side only reads it, and only until the transfer's end is handed over
  // (the engine may free it from then on). A transfer kept past its end
  // (stuck) reads `kept`, its own copy, instead: spec() says which.
  const kv::TransferSpec* engine_spec = nullptr;
  std::optional<kv::TransferSpec> kept;
  // The engine's event after the last forward touching these blocks; held
  // until it is seen complete (Connector's producer contract).
  std::shared_ptr<const hip::Event> producer;
  // A load: recorded after its copies once they are queued, then
  // on_queued() runs (Connector::order_after_load waits on it).
  std::shared_ptr<hip::Event> queued_event;
  std::function<void()> on_queued;
  TransferState state = TransferState::queued;
  Clock::time_point posted{};
  Clock::time_point deadline{};
  std::error_code error;
  std::string reason;

  bool terminal() const noexcept { return state == TransferState::done || state == TransferState::failed; }
  // Before an end is handed over for a transfer that stays (its copy may
  // still run): from now on it reads its own copy.
  void keep() {
    if (!kept) kept = *engine_spec;
  }
  const kv::TransferSpec& spec() const noexcept { return kept ? *kept : *engine_spec; }
};

}  // namespace kvstrand::reactor
