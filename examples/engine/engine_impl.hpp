// The example engine's state and step loop (Engine::Impl), shared by the
// files that define its parts: engine.cpp (construction, the step, the
// loop), engine_requests.cpp (admission, preemption, the Connector's
// answers), engine_saves.cpp (saves), engine_device.cpp (device writes
// through the staging area, verification against a full recompute).
// Private to the example: nothing outside examples/engine includes it.
#pragma once

#include "engine.hpp"

#include <spdlog/spdlog.h>

#include <boost/asio/async_result.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <array>
#include <cstring>
#include <deque>
#include <list>
#include <stdexcept>

#include <kvstrand/chunk_keys.hpp>
#include <kvstrand/sim.hpp>
#include <kvstrand/hit_plan.hpp>
#include <kvstrand/namespace_id.hpp>
#include <kvstrand/save_tracker.hpp>
#include <kvstrand/transfer_spec.hpp>
#include "kv_pool.hpp"
#include "toy_model.hpp"

namespace kvstrand::engine {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;

struct Request {
  std::uint64_t n = 0;
  std::string id;
  std::uint32_t prompt_index = 0;
  std::vector<std::uint32_t> tokens;
  std::vector<kv::Digest> block_hashes;  // full prompt blocks, chained
  std::vector<kv::ChunkKey> keys;        // full prompt chunks
  enum class Phase { waiting, loading, running } phase = Phase::waiting;
  std::uint32_t generation = 0;
  bool preempted_loading = false;  // its last load was fenced away by a preemption
  // Tier lookup: sent once per request; answered or not.
  std::optional<std::uint64_t> lookup_id;
  bool lookup_answered = false;
  std::optional<kv::HitSource> tier_hit;
  std::uint64_t tier_lease = 0;  // keeps tier_hit stored until a load names it or it is released
  // The draft group's (EngineConfig::draft_cache): its keys, and its lookup's answer.
  std::vector<kv::ChunkKey> draft_keys;
  std::optional<std::uint64_t> draft_lookup_id;
  bool draft_answered = false;
  std::optional<kv::HitSource> draft_hit;
  std::uint64_t draft_lease = 0;
  std::vector<kv::BlockId> table;
  std::int32_t slot = -1;
  std::uint32_t computed = 0;  // tokens [0, computed) have KV in the table
  ToyState state;
  std::vector<std::uint32_t> outputs;
  kv::SaveTracker tracker;
  std::uint64_t save_seq = 0;
  std::string load_name;
  RequestRecord rec;
  double last_token = 0;
  std::size_t stamped = 0;  // outputs whose time is recorded

  explicit Request(std::uint32_t chunk_tokens) : tracker(chunk_tokens) {}
  std::uint32_t prompt() const { return static_cast<std::uint32_t>(tokens.size()); }
  bool prefilling() const { return computed < prompt(); }
};

// A finished request's remaining chunks, waiting for its save in flight
// (one per request) to settle. Its sources are leased already.
struct TailSave {
  std::vector<kv::TransferSpec> specs;  // the target's, then the draft group's
  std::vector<std::int32_t> pinned;
};

// A load posted to the Connector: the request that posted it, and its
// destinations' record in CommittedBlocks (settled once, when the load lands,
// fails or is fenced away by a preemption).
struct LoadInFlight {
  std::uint64_t request = 0;
  std::uint64_t record = 0;
  bool settled = false;
  int outcomes_left = 1;  // one per group: the load landed when every group's did
  bool ok = true;
  std::string reason;
};

struct SaveInFlight {
  std::uint64_t request = 0;
  kv::BlockLeases::LeaseId lease = 0;
  std::vector<std::int32_t> pinned;
  bool settled = false;  // its outcome arrived (every group's)
  bool safe = false;     // its source blocks were released
  int outcomes_left = 1;  // one per group
  int unsafe_left = 1;    // groups still reading the source blocks
  bool ok = true;
};

inline constexpr std::uint64_t kDraftSalt = 0xd4af7ull;  // the draft model's KV differs from the target's

struct Engine::Impl {
  EngineConfig cfg;
  Workload work;
  ToyModel model;
  KvPool pool;
  kv::Digest ns{};
  kv::ChunkHasher hasher;
  DeviceStream stream;
  // The step's device writes go through pinned staging, in two halves used
  // by alternate steps: a step's copies may still be queued while the next
  // step fills the other half. Before a half is reused, the step that last
  // used it must have run (its event, two steps old: complete in the
  // steady state). The engine's stream is never synchronized per step.
  std::optional<HostMemory> staging;
  std::size_t half_bytes = 0;
  std::uint32_t side = 0;   // the half this step writes through
  std::size_t staged = 0;   // bytes of it used
  std::array<std::optional<DeviceEvent>, 2> half_done;
  std::optional<HostMemory> readback;
  // The draft model's cache (EngineConfig::draft_cache): a second
  // registration over the same block ids as the target's pool.
  std::optional<kv::Layout> draft_layout;
  std::optional<ToyModel> draft_model;
  std::optional<DeviceMemory> draft_plane;
  kv::Digest draft_ns{};
  std::uint32_t draft_reg = 0;
  std::unique_ptr<Connector> conn;
  std::map<std::uint32_t, ToyModel::Reference> references;
  std::map<std::uint32_t, std::vector<std::uint32_t>> prompts;

  std::map<std::uint64_t, std::unique_ptr<Request>> live;  // by n
  std::deque<std::uint64_t> waiting;
  std::list<std::uint64_t> running;  // admission order
  std::map<std::uint64_t, std::pair<std::uint64_t, bool>> lookup_owner;  // lookup id -> (request n, draft group?)
  std::vector<LookupOutcome> held_answers;  // cfg.hold_lookup_answers
  std::map<std::string, LoadInFlight> loads;            // load name -> its request and record
  std::map<std::string, SaveInFlight> saves;            // save name -> in flight
  std::map<std::uint64_t, TailSave> tails;              // finished request n -> its tail save
  // Running slot -> (request, generation) that owns it (F4).
  std::map<std::int32_t, std::pair<std::uint64_t, std::uint32_t>> slot_owner;

  RunStats stats;
  double clock = 0;
  // Real time the step thread spent inside kvstrand calls this step: it is
  // engine time, so it goes on the clock with the modeled compute.
  double call_seconds = 0;

  template <class F>
  auto timed(F&& f) {
    const auto t0 = Clock::now();
    struct Add {
      Impl* self;
      Clock::time_point t0;
      ~Add() { self->call_seconds += std::chrono::duration<double>(Clock::now() - t0).count(); }
    } add{this, t0};
    return f();
  }
  std::uint64_t next_n = 1;
  std::uint64_t load_seq = 1;

  Impl(EngineConfig c, Workload w);

  // Copies out of the staging area may still be queued (no step waits for
  // its own): they run before the staging area is freed.
  ~Impl();

  // ---- device writes through the step's staging area ----------------------

  std::byte* stage(std::size_t n);

  // What a transfer posted now waits for: everything queued on the
  // engine's stream so far (a save: the step's writes of its blocks; a
  // load: every write queued to blocks that may have been another
  // request's). kvstrand records its own event there at the post.
  Producer engine_point() const { return Producer::after_stream(stream.native()); }

  // The end of a step's device work: its staging half is free once it has run.
  void end_step();
  void write_image(std::int32_t slot, const ToyState& s);
  ToyState read_image(std::int32_t slot);
  HostMemory& readback_buffer(std::uint64_t n);

  // Computes tokens [a, b) into the table; seq[u - a] is token u.
  void compute(Request& r, std::uint32_t a, std::uint32_t b, const std::uint32_t* seq);

  // ---- requests ---------------------------------------------------------------

  void arrive();

  kv::HitSource hbm_hit(const Request& r) const;

  // The highest frontier any source could give this prompt.
  std::uint32_t grid_ceiling(const Request& r) const;

  // Where a request resumes. With the draft group, both groups are planned
  // together (kv::plan_groups): the draft's blocks mirror the target's, so
  // HBM holds the same tokens of both, and a load must bring both groups'
  // bytes for its blocks: the tier source of each is the least of what the
  // two groups' lookups found (the target's checkpoints within it).
  kv::HitPlan plan_request(const Request& r, kv::HitInputs in) const;

  // The tier's answers hold leases (kvstrand-server): given back when no
  // load will name them (F20).
  void release_leases(Request& r);

  // The draft group's transfer of the target spec's tokens and blocks.
  kv::TransferSpec draft_spec(const Request& r, const kv::TransferSpec& target) const;

  // One admission attempt. False: stop admitting this step (no memory).
  bool admit(Request& r);

  // The Connector's fence, co_awaited from this loop: its completion runs on
  // kvstrand's reactor thread and only posts the result here. The exception
  // is moved, never copied, so this thread holds its last reference.
  asio::awaitable<void> fence(std::vector<std::string> requests);

  // Frees what a running request holds and puts it back at the front of the
  // queue, a new generation. A load into its blocks is fenced first; a fence
  // that cannot cover it throws FailStop out of the step loop before any
  // block is freed: a copy may still write them (fail-stop, F1).
  asio::awaitable<void> preempt(Request& r);

  // The image in the request's slot is the state after exactly `end`
  // committed tokens, a chunk end whose blocks HBM now caches: it becomes
  // HBM's checkpoint there, as a computed one would (F6, F7), so the next
  // request on this prefix resumes from HBM instead of loading the chunk
  // again. The slot budget and eviction with the blocks are the pool's.
  void keep_checkpoint(const Request& r, std::uint32_t end);

  void settle_record(LoadInFlight& l, bool landed);

  void release_request(Request& r);

  // ---- completions --------------------------------------------------------------

  // The lookup answers to act on now: all of them, unless a test holds one
  // prompt's (cfg.hold_lookup_answers).
  std::vector<LookupOutcome> answers_due(std::vector<LookupOutcome> arrived);

  void drain();

  void on_load(const TransferOutcome& outcome);

  // ---- saves ----------------------------------------------------------------------

  void post_saves(Request& r);

  // The save of `range` of `r`: sources leased, checkpoint slots pinned;
  // with the draft group, its save of the same blocks second. Empty: no
  // committed sources.
  std::vector<kv::TransferSpec> build(Request& r, kv::TokenRange range, std::vector<std::int32_t>* pinned);

  std::optional<kv::TransferSpec> build_target(Request& r, kv::TokenRange range, std::vector<std::int32_t>* pinned);

  // One save per group, in one submit; the source lease (the target's
  // spec's) is released once every group's copy out of the blocks ended.
  void post(std::uint64_t n, std::vector<kv::TransferSpec> specs, std::vector<std::int32_t> pinned);

  // ---- verification -------------------------------------------------------------

  const ToyModel::Reference& reference(std::uint32_t prompt);

  // A resumed request at the end of its prefill: every prompt KV byte and the
  // state image against a full recompute.
  void verify_prefill(Request& r);

  void mismatch(const Request& r, const std::string& what);

  // ---- the step ----------------------------------------------------------------------

  struct StepWork {
    std::uint64_t prefill_tokens = 0, outputs = 0;
  };

  asio::awaitable<StepWork> step();

  void produce_token(Request& r);

  // Called after the step's modeled time is on the clock.
  void stamp_tokens(const StepWork&);

  void finish(Request& r);

  bool warm = false;

  asio::awaitable<void> loop(std::uint32_t warmup, double seconds, std::uint64_t max_requests,
                             std::function<void(const Progress&)> progress);
};

}  // namespace kvstrand::engine
