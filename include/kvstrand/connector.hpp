// The engine-facing API: what an inference engine calls to offload and
// restore KV blocks without its step thread stalling. No Boost and no vendor
// type here: device memory, streams and events are integers (their
// addresses and handles), and the library's own Asio stays inside it.
//
// Threads: one engine thread calls a Connector (not several at once).
// save(), load(), submit(), lookup(), release_lookup(), adopt_lease() and
// order_after_load() only post or read; finished() reads what already
// arrived. Only fence() and close() wait; fence has a callback form and a
// C++20 coroutine form (`co_await conn.fenced(...)`).
//
// Lifetimes: the device memory named at registration must stay valid until
// every transfer naming it is terminal (seen in finished(), or covered by a
// fence that returned).
//
// Errors: TransferRefused (nothing was posted; the message says why) and
// FailStop (a transfer's deadline passed: no block may be reused; raised by
// every later call) from <kvstrand/errors.hpp>; std::invalid_argument
// naming the option for options kvstrand cannot serve.
#pragma once

#include <chrono>
#include <coroutine>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/device_memory.hpp>
#include <kvstrand/errors.hpp>
#include <kvstrand/finished.hpp>
#include <kvstrand/registration.hpp>
#include <kvstrand/transfer_spec.hpp>
#include <kvstrand/version.hpp>

#pragma GCC visibility push(default)  // the library's ABI; the rest of it is hidden
namespace kvstrand {

class Connector;
namespace sim {
NativeStream load_stream(Connector& connector);  // <kvstrand/sim.hpp>
}

struct ConnectorOptions {
  // Every transfer's own deadline; passing it is fail-stop. Must be > 0.
  std::chrono::milliseconds transfer_deadline{60'000};
  // The embedded tier's host arena (when server_socket is empty).
  std::uint64_t tier_bytes = 1ull << 30;
  // The node tier: kvstrand-server's socket. Empty: an embedded tier.
  std::string server_socket;
  // Node tier: bound on connect + hello + register and on each lookup.
  std::chrono::milliseconds server_request_timeout{10'000};
  // Node tier: the server is spoken to only when its process (the socket's
  // peer) runs as this process's user, as root, or as this uid (-1: no
  // other). Another user who bound the socket's path first would otherwise
  // receive every save and serve its own bytes as hits.
  std::int64_t server_uid = -1;
  int device = 0;  // the device the reactor thread and the tier's copies use
  // Bounds on what is posted and not yet drained from finished().
  std::size_t max_live_transfers = 4096;
  std::size_t max_live_lookups = 4096;
  // The read-only debug endpoint (/healthz, /debug/*, /metrics): off when
  // negative, 0 for any free port (debug_port() says which). Loopback only.
  int debug_port = -1;
  std::string debug_address = "127.0.0.1";
  // How long the reactor thread keeps polling for the engine's next call
  // once nothing is in flight. Meanwhile a call hands its work over with a
  // few stores; after it, the reactor sleeps and the next call wakes it
  // (a syscall and a cross-CPU wake-up on the step thread: several
  // microseconds, tens in some VMs). The price is one busy core for that
  // long after each call. 0: sleep at once. Must be >= 0.
  std::chrono::microseconds reactor_idle_spin{2000};
  // How a load's scattered segments reach the device: "rule" (the
  // default: the gather kernel, one batched DMA call when every segment is
  // 1 MiB or more), "measure" (each register_layout times the gather
  // kernel and one batched DMA call on its segment sizes, each size once a
  // process, and each load takes the faster for its segments' sizes;
  // /debug/load-path and the kvstrand_load_path_* metrics say what was
  // measured and chosen. Not yet the default: the choice as shipped has
  // not yet run on every kind of GPU host, docs/performance-history.md),
  // "kernel" or "dma-batch" (forced; refused where this build has no such
  // path).
  // Process-wide: the last Connector constructed sets it.
  std::string load_path = "rule";
};

// What a transfer waits for on the device before it touches its blocks: the
// engine's forward pass that wrote them (a save) or last read them (a load).
class Producer {
 public:
  Producer() = default;  // nothing to wait for
  // Whatever is queued on the engine's stream now: kvstrand records an
  // event of its own on it at the post. The stream is never synchronized.
  static Producer after_stream(NativeStream stream) noexcept { return Producer(Kind::stream, stream); }
  // The engine's own event, recorded already. The engine keeps it alive
  // until the transfer is terminal, and records it again, if at all, only on
  // the same stream.
  static Producer after_event(NativeEvent event) noexcept { return Producer(Kind::event, event); }

  enum class Kind { none, stream, event };
  Kind kind() const noexcept { return kind_; }
  std::uintptr_t handle() const noexcept { return handle_; }

 private:
  Producer(Kind k, std::uintptr_t h) noexcept : kind_(k), handle_(h) {}
  Kind kind_ = Kind::none;
  std::uintptr_t handle_ = 0;
};

struct Op {
  TransferKind kind = TransferKind::save;
  kv::TransferSpec spec;
  Producer producer;
};

class Connector {
 public:
  // Where a coroutine continues after co_await fenced(...): a function that
  // runs its argument on the engine's own executor (for an Asio engine,
  // [ex](auto f) { asio::post(ex, std::move(f)); }).
  using Resume = std::function<void(std::function<void()>)>;
  class FenceAwaitable;

  explicit Connector(ConnectorOptions options = {});
  // close(), then frees everything.
  ~Connector();
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;

  // Adds a registration (a KV-cache group: a hybrid model registers each
  // group, a draft model its own) and returns its id, which specs and
  // lookups name: 0, then 1, 2, ... Blocks until the tier has attached it.
  std::uint32_t register_layout(const Registration& registration);

  // Post one transfer and return at once. Throws TransferRefused, posting
  // nothing, for: a live transfer of the same kind for the request
  // (duplicate_transfer), no registration, a spec that does not fit, a
  // closed connector, max_live_transfers reached (too_many_live), blocks or
  // image slots a live transfer uses (blocks_in_use: a load may name none a
  // live save reads or a live load writes; a save none a live load writes;
  // two saves may read the same ones). A FailStop already set is raised
  // here too.
  void save(kv::TransferSpec spec, Producer producer = {});
  void load(kv::TransferSpec spec, Producer producer = {});
  // A whole step's transfers: all checked first; if one is refused, none is posted.
  void submit(std::vector<Op> ops);

  // What the tier holds of `keys` (of `registration`'s layout); the answer
  // arrives in finished().lookups under the returned id, with the lease
  // that keeps the hit stored until a load names it or it is released.
  std::uint64_t lookup(std::vector<kv::ChunkKey> keys, std::uint32_t registration = 0);
  void release_lookup(std::uint64_t lease);
  // Drops every object of `registration`'s namespace from the tier (an
  // online weight update that keeps the namespace; a new
  // Layout::weight_version is a new namespace instead): no lookup finds one
  // once this returns, loads running now still complete. Blocks until the
  // tier answered; returns how many objects it dropped. Throws
  // TransferRefused: not_registered, closed, or tier_unavailable (no
  // kvstrand-server answers, or one older than protocol 2.3).
  std::uint64_t invalidate(std::uint32_t registration = 0);
  // Node tier: a lease as bytes for another process (a scheduler hands a
  // worker what it looked up), and the taking over of such bytes; the
  // adopted hit arrives in finished().lookups under the returned id (a miss
  // when the lease is gone).
  std::vector<std::byte> export_lease(std::uint64_t lease);
  std::uint64_t adopt_lease(std::span<const std::byte> handoff);

  // Makes the engine's stream wait, on the device, for the copies of the
  // live load of `request`: its next forward may be queued at once.
  LoadOrder order_after_load(const std::string& request, NativeStream stream, std::uint32_t registration = 0);

  // Everything that became terminal since the last call. Never waits; with
  // nothing to drain it takes no lock (one atomic load).
  Finished finished();
  // Whether finished() has something to return (or a fail-stop to raise):
  // one atomic load, for a caller that would rather not build an empty
  // result (the Python binding's common case).
  bool finished_pending() const noexcept;

  // Returns when every transfer of `requests` is terminal. Throws FailStop
  // when `timeout` passes first.
  void fence(const std::vector<std::string>& requests, std::chrono::milliseconds timeout);
  // The same, without waiting: `done` runs once, on kvstrand's reactor
  // thread, with what fence() would have thrown (null: none). It must not
  // call the Connector there; post to the engine's own thread instead.
  void fence_async(std::vector<std::string> requests, std::chrono::milliseconds timeout,
                   std::function<void(std::exception_ptr)> done);
  // The coroutine form: `co_await conn.fenced(requests, timeout, resume)`
  // continues through `resume` and throws what fence() would.
  FenceAwaitable fenced(std::vector<std::string> requests, std::chrono::milliseconds timeout, Resume resume);

  // Lets in-flight transfers settle (bounded by their deadlines), then stops
  // the reactor and releases the tier. Idempotent.
  void close();
  // After close(): how many transfers' copies were never seen to end (a
  // deadline fail-stop, or close's own bound). While it is not 0, keep the
  // memory you registered allocated until the process exits: such a copy
  // may still read or write it. 0 before close() returns.
  std::size_t never_ended() const noexcept;

  // The debug endpoint's port; 0 when it is off.
  std::uint16_t debug_port() const noexcept;

 private:
  friend NativeStream sim::load_stream(Connector& connector);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class Connector::FenceAwaitable {
 public:
  FenceAwaitable(Connector& c, std::vector<std::string> requests, std::chrono::milliseconds timeout, Resume resume)
      : c_(c), requests_(std::move(requests)), timeout_(timeout), resume_(std::move(resume)) {}
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) {
    // `this` lives in the suspended coroutine's frame until it resumes;
    // after `resume` is called the frame may be gone, so the callback owns
    // its own copy of `resume` and touches nothing of `this` after it.
    c_.fence_async(std::move(requests_), timeout_, [this, h, resume = resume_](std::exception_ptr e) {
      error_ = std::move(e);  // the engine's thread holds the only reference
      resume([h] { h.resume(); });
    });
  }
  void await_resume() {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  Connector& c_;
  std::vector<std::string> requests_;
  std::chrono::milliseconds timeout_;
  Resume resume_;
  std::exception_ptr error_;
};

inline Connector::FenceAwaitable Connector::fenced(std::vector<std::string> requests,
                                                   std::chrono::milliseconds timeout, Resume resume) {
  if (!resume) throw std::invalid_argument("fenced: resume is required (the coroutine must continue on the engine's "
                                           "executor, not on kvstrand's reactor thread)");
  return FenceAwaitable(*this, std::move(requests), timeout, std::move(resume));
}

}  // namespace kvstrand
#pragma GCC visibility pop
