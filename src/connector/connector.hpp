// The engine-facing API: what an inference engine calls to offload and
// restore KV blocks without its step thread stalling.
//
// Threads: one engine thread calls a Connector (its methods are not for
// several engine threads at once); everything they start runs as coroutines
// on the reactor strand. save(), load(), submit() and lookup() only post;
// finished() reads what already arrived. Only fence() and close() wait, and
// each has a coroutine form (async_fence, async_close) for engines that
// co_await at step boundaries on their own executor.
//
// Lifetimes: the device memory named at registration must stay valid until
// every transfer naming it is terminal (seen in finished(), or covered by a
// fence that returned).
//
// The producer event: the engine records it on its stream after the work
// that writes (save) or last reads (load) the transfer's blocks, and hands
// it over shared. The Connector holds its reference until the transfer has
// seen the event complete (or ended), so the engine may drop its own at
// once. The engine may record the event again, on that same stream, at any
// time: the reactor queries the latest record, which completes after the
// first; recording it on another stream meanwhile is not allowed (the
// transfer could then start before the work it waits for).
#pragma once

#include <kvstrand/connector.hpp>

#include <boost/asio/any_completion_handler.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/bind_executor.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <kvstrand/transfer_spec.hpp>
#include "common/debug_http.hpp"
#include "common/metrics.hpp"
#include "device/stream.hpp"
#include "connector/admission.hpp"
#include "connector/lookup_book.hpp"
#include "connector/mailbox.hpp"
#include "reactor/reactor.hpp"
#include "data_path/registration.hpp"
#include "index_plane/index_plane.hpp"
#include "index_plane/transfer_error.hpp"
#include "connector/transfer_table.hpp"
#include "tier/index.hpp"

namespace kvstrand::connector {

using common::DebugHttp;
using common::HttpOptions;
using common::AtomicHistogram;

// The public options (include/kvstrand/connector.hpp: the deadline, the
// tier, the device, the bounds, the debug endpoint) and what only the
// library's own code and its tests set. One set of fields: the public
// Connector passes its options through as they are.
struct ConnectorOptions : kvstrand::ConnectorOptions {
  // The poller and event pool; its device is always `device` above.
  reactor::ReactorOptions reactor;
  // The debug endpoint in full (allow_non_loopback): when set it is used
  // instead of debug_port / debug_address.
  std::optional<HttpOptions> http;
  // The index plane under the tier's data path (tests' doubles); when
  // empty, a LocalIndex of tier_bytes or, with server_socket, a RemoteIndex.
  std::function<std::unique_ptr<index_plane::IndexPlane>(reactor::Reactor&)> make_index;
};

// Refuses options kvstrand cannot serve, naming the option.
std::optional<kv::ConfigError> validate(const ConnectorOptions& options);

class Connector {
 public:
  using Op = connector::Op;

  // Throws std::invalid_argument naming the option for invalid options.
  explicit Connector(ConnectorOptions options = {});
  ~Connector();
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;

  // Adds a registration (one KV-cache group: a hybrid model's attention,
  // sliding-window and state groups, a draft model's cache) and returns its
  // id, which specs and lookups name: 0 for the first, then 1, 2, ... Blocks
  // until the tier has attached the memory. Throws TransferRefused
  // (bad_spec) naming what does not fit.
  std::uint32_t register_layout(Registration registration);

  // Post one transfer and return at once. Throws TransferRefused, posting
  // nothing, for: a live transfer of the same kind for the request
  // (duplicate_transfer), no registration, a spec that does not fit, a
  // closed connector, max_live_transfers reached (too_many_live), blocks or
  // image slots a live transfer uses (blocks_in_use: a load may name none a
  // live save reads or a live load writes; a save none a live load writes;
  // two saves may read the same ones). kvstrand refuses rather than orders
  // them: the engine's scheduler decides which goes first. A FailStop
  // already set is raised here too.
  void save(kv::TransferSpec spec, std::shared_ptr<const device::Event> producer = nullptr);
  void load(kv::TransferSpec spec, std::shared_ptr<const device::Event> producer = nullptr);
  // A whole step's transfers in one post. All are checked first; if one is
  // refused, none is posted.
  void submit(std::vector<Op> ops);

  // Asks the tier what it holds of `keys`; the answer arrives in
  // finished().lookups under the returned id, with the lease (node tier)
  // that keeps the hit stored until a load names it (spec.tier_lease) or
  // release_lookup gives it back. A lease is never given back by a clock:
  // an engine that drops one holds those objects until its process exits.
  std::uint64_t lookup(std::vector<kv::ChunkKey> keys, std::uint32_t registration = 0);

  // Makes `stream` (the engine's) wait, on the device, for the copies of
  // the live load of `request` into `registration`: work the engine queues
  // on it afterwards may read the loaded blocks, with no thread waiting.
  // The load's outcome still arrives in finished(); a load whose copies are
  // queued fails only by a fail-stop (its deadline), which every later call
  // raises. Never waits.
  LoadOrder order_after_load(const std::string& request, device::Stream& stream, std::uint32_t registration = 0);

  // Hands a lookup's lease to another process (a worker that loads what
  // this scheduler looked up): plain bytes the engine carries in its own
  // metadata. This Connector forgets the lease (no load here may name it,
  // and close() does not end it); until a Connector adopts it, it is this
  // process's (freed if it exits). Node tier only; throws TransferRefused
  // (bad_spec) for a lease this Connector does not hold.
  std::vector<std::byte> export_lease(std::uint64_t lease);
  // Takes over an exported lease on this process's session of the same
  // kvstrand-server (freed if this process exits), for the registration
  // whose layout made the keys. Only posts: the answer arrives in
  // finished().lookups under the returned id, like a lookup's (a miss when
  // the lease is gone: its exporter exited, or it was adopted already).
  // Throws TransferRefused (bad_spec) for bytes that are not a handoff, or
  // whose keys no registration here makes.
  std::uint64_t adopt_lease(std::span<const std::byte> handoff);

  // Drops every object of `registration`'s namespace from the tier (an
  // online weight update under the same namespace): no lookup finds one
  // once this returns; loads running now still read theirs. Blocks until
  // the tier answered; returns how many objects it dropped (the node tier:
  // its arena's and disk's). Throws TransferRefused: not_registered,
  // closed, tier_unavailable (no server answers, or one before protocol 2.3).
  std::uint64_t invalidate(std::uint32_t registration = 0);

  // A lookup whose hit this engine will not load (the planner chose not to,
  // or the request went away): frees its lease now (F20). Only posts; a
  // no-op for lease 0 or on a closed connector.
  void release_lookup(std::uint64_t lease);
  // Everything that became terminal since the last call. Never waits. Once a
  // fail-stop error is set it throws FailStop on every call.
  Finished finished();
  bool finished_pending() const noexcept;

  // Returns when every transfer of `requests` is terminal, whatever state it
  // was in. Throws FailStop when `timeout` passes first (and sets the
  // fail-stop error), or when one is already set.
  void fence(const std::vector<std::string>& requests, std::chrono::milliseconds timeout);

  // The coroutine (or any token) form: completes with a null exception_ptr
  // once every transfer of `requests` is terminal, and otherwise with what
  // fence() would throw (FailStop for a timeout or a fail-stop already set,
  // TransferRefused on a closed connector). Under use_awaitable the co_await
  // throws it: a fence that did not cover its transfers cannot be taken for
  // one that did, and their blocks must not be reused. It never needs a
  // timer raced beside it; `timeout` is its own.
  template <boost::asio::completion_token_for<void(std::exception_ptr)> Token>
  auto async_fence(std::vector<std::string> requests, std::chrono::milliseconds timeout, Token&& token) {
    return boost::asio::async_initiate<Token, void(std::exception_ptr)>(
        [this, r = std::move(requests), timeout](auto handler) mutable {
          // The strand's fence completes with an error_code; the caller gets
          // the exception it stands for, on its own executor (bound here,
          // from the concrete handler).
          auto ex = boost::asio::get_associated_executor(handler);
          auto to_exception = [h = std::move(handler), mailbox = mailbox_](std::error_code ec) mutable {
            std::move(h)(fence_exception(*mailbox, ec));
          };
          start_fence(std::move(r), timeout, Handler(boost::asio::bind_executor(ex, std::move(to_exception))));
        },
        token);
  }

  // Lets in-flight transfers settle (bounded by their deadlines, and by
  // close_bound() whatever happens), then stops the reactor and releases the
  // tier. Idempotent; safe before registration. Completions that arrived
  // stay readable through finished().
  void close();

  // After close(): how many transfers' copies were never seen to end (failed
  // by a deadline, or abandoned by close). While it is not 0 the engine must
  // keep the memory they name (its blocks and state slots) allocated for the
  // life of the process: such a copy may still read or write it. 0 before
  // close() returns.
  std::size_t never_ended() const noexcept;

  // The coroutine form: refuses new work at once and completes when every
  // transfer has settled. Stopping the reactor thread is left to close() or
  // the destructor, which then no longer wait for any transfer.
  template <boost::asio::completion_token_for<void(std::error_code)> Token>
  auto async_close(Token&& token) {
    return boost::asio::async_initiate<Token, void(std::error_code)>(
        [this](auto handler) { start_close(Handler(std::move(handler))); }, token);
  }

  // The reactor, for engines that run their own coroutines beside kvstrand's
  // (never touching its state) and for tests.
  reactor::Reactor& reactor() noexcept { return *reactor_; }

  // Debug views (they hop to the strand and back: not for the step loop).
  std::vector<TransferInfo> transfers();
  // Ended transfers the strand keeps for its next starts (TransferTable::
  // keep_ended; at most TransferTable::kSpareTransfers).
  std::size_t kept_transfers();
  tier::Index::Stats tier_stats();
  reactor::PollerStats poller_stats();
  device::EventPool::Stats event_stats();
  // The native stream the tier queues loads' copies on (null: a tier with
  // none, or none yet): what the sim's fault hooks hold or fail in tests of
  // an engine that reaches kvstrand through its public API only.
  void* load_stream_native();
  // The tier's save and load streams (null before the first registration or
  // after close): what tests hold, delay or fail with the sim's hooks.
  struct TierStreams {
    device::Stream* save = nullptr;
    device::Stream* load = nullptr;
  };
  TierStreams tier_streams();
  // The node tier's arena (how many times it was mapped and pinned, how
  // many server restarts kept it, how much is pinned) and its connection;
  // zeros for the embedded tier. Read on the strand.
  using ArenaMappings = index_plane::IndexPlane::ServerLink;
  ArenaMappings arena_mappings();
  // The debug endpoint's port (0 when it is off).
  std::uint16_t http_port() const noexcept { return http_ ? http_->port() : 0; }

 private:
  using Handler = TransferTable::Handler;

  // Fail-stop, closed, then the registration: what every post checks first.
  void raise_fail_stop() const;
  void check_open() const;
  // submit()'s work, for a batch held anywhere (save() and load(): one Op
  // on the stack).
  void submit_ops(std::span<Op> ops);
  void start_fence(std::vector<std::string> requests, std::chrono::milliseconds timeout, Handler handler);
  // What a fence that completed with `ec` throws (null: nothing).
  static std::exception_ptr fence_exception(const Mailbox& mailbox, std::error_code ec);
  void start_close(Handler handler);
  // Posts `f` to the strand to run after every submit() made before it.
  template <class F>
  void post_after_submissions(F f);

  ConnectorOptions options_;
  std::unique_ptr<reactor::Reactor> reactor_;
  std::shared_ptr<AtomicHistogram> step_calls_;  // only with the debug endpoint on
  std::unique_ptr<DebugHttp> http_;
  // The strand's half: reached only by the submission ring and posts (and,
  // once the reactor thread has ended, read by close() and never_ended()).
  std::shared_ptr<TransferTable> table_;
  // table_'s submission ring, as this thread reaches it: a pointer of its
  // own, not read out of the table, whose lines the strand writes.
  reactor::HandoffQueue<Submission>* submissions_ = nullptr;
  std::shared_ptr<Mailbox> mailbox_;
  Drained drained_;  // finished()'s, reused: its vectors trade places with the mailbox's
  // The engine thread's half: what this thread posted and has not yet drained.
  Admission admission_;
  LookupBook lookups_;
  bool closed_ = false;   // no new work is accepted
  bool stopped_ = false;  // the reactor thread has ended and the tier is released
};

}  // namespace kvstrand::connector
