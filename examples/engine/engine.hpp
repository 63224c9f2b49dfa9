// A small but real inference-engine skeleton that embeds kvstrand.
//
// The step loop is a coroutine on the engine's own thread; it co_awaits at
// step boundaries (the step's modeled time, a fence before reusing a
// preempted request's blocks, the connector's close) and never waits on a
// transfer otherwise. Each step:
//   1. drains finished(): lookups, loads, saves, source-safe blocks;
//   2. admits waiting requests: HBM prefix-cache hit (with checkpoints),
//      a non-blocking tier lookup (the request is deferred until it is
//      answered), the planner's decision (kv::plan_hit), blocks, a load;
//   3. runs the toy model: chunked prefill on the chunk grid
//      (kv::prefill_chunk_end) and one decode token per running request,
//      preempting the newest request when a decode block cannot be had;
//   4. posts saves of newly committed chunks (kv::SaveTracker, build_save).
// Time is modeled (CostModel) and, with time_scale 1, also spent for real,
// so transfers overlap steps as they would on a GPU.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <kvstrand/connector.hpp>
#include <kvstrand/layout.hpp>
#include "workload.hpp"

namespace kvstrand::engine {

struct EngineConfig {
  kv::Layout layout;
  std::uint32_t pool_blocks = 4000;
  std::uint32_t concurrency = 16;  // requests outstanding (closed loop); also the running slots
  std::uint32_t checkpoint_slots = 0;  // 0: one per chunk the pool can hold
  std::uint32_t max_batched_tokens = 4096;
  bool hbm_cache = true;
  bool tier = false;
  std::string server_socket;  // tier through kvstrand-server instead of the embedded tier
  std::uint64_t tier_bytes = 1ull << 30;
  std::uint32_t min_load_tokens = 256;
  // The connector's debug endpoint (tier arms): off when negative, 0 for any free port.
  int debug_port = -1;
  std::string debug_address = "127.0.0.1";
  std::chrono::milliseconds transfer_deadline{30'000};
  std::chrono::milliseconds fence_timeout{30'000};  // a preemption's fence of its load
  // 1: steps of the measured window take their modeled time for real (the
  // warm-up runs as fast as it can); 0: everything as fast as possible.
  double time_scale = 1.0;
  // Admission takes the blocks of the prompt and of every output token at
  // once, so decoding never runs out; false allocates output blocks as they
  // are needed and preempts under pressure.
  bool reserve_outputs = true;
  bool verify = true;       // compare every resumed request with a full recompute
  // A second registration: a draft model's KV cache (speculative decoding),
  // its own layout (one plane of half the target's first plane per token,
  // no state), keys and tier objects, sharing the target's block table as a
  // draft model does. Every save, lookup and load is posted for both groups.
  bool draft_cache = true;
  CostModel cost;
  // Tests: a preemption of the newest loading request every N steps (0: off).
  std::uint32_t preempt_loading_every = 0;
  // Tests, sim backend only: every operation on the engine's own stream
  // waits this long (copies stay queued while the step goes on).
  std::chrono::microseconds sim_stream_delay{0};
  // Tests: the tier's answers to this prompt's lookups are held until this
  // many requests are done (0: off), as a reactor that the scheduler stalls
  // while the step thread runs on would hold them.
  struct {
    std::uint32_t prompt = 0;
    std::uint64_t until_done = 0;
  } hold_lookup_answers;
};

// Refuses a configuration the engine cannot serve correctly, naming the option.
std::optional<kv::ConfigError> validate(const EngineConfig& config, const Workload& workload);

struct RequestRecord {
  std::uint64_t n = 0;
  std::uint32_t prompt = 0;
  double arrival = 0, first_token = 0, finish = 0;  // modeled seconds
  std::vector<double> itl;                          // gaps between output tokens, seconds
  std::uint32_t prompt_tokens = 0, ceiling = 0;  // the last resumable point: the chunk grid below the prefill tail
  std::uint32_t hbm_tokens = 0, tier_tokens = 0, computed_tokens = 0;
  std::optional<std::uint32_t> load_begin;
  std::uint32_t preemptions = 0;
  bool resumed = false;
  bool looked_up = false;  // asked the tier (never while HBM holds the prompt: F31)
};

struct RunStats {
  std::vector<RequestRecord> done;  // in completion order
  double warm_at = 0;               // modeled time the warm-up requests had finished
  double end_at = 0;
  std::uint64_t resumed = 0, verified = 0, mismatches = 0;
  std::uint64_t checkpoints_checked = 0;
  std::uint64_t lookups = 0;
  std::uint64_t deferred_steps = 0, loads = 0, loads_failed = 0, loads_from_zero = 0;
  double kvstrand_call_seconds = 0;  // step-thread time inside kvstrand calls (on the clock too)
  std::uint64_t saves = 0, saves_failed = 0, preemptions = 0, stale_outcomes = 0, steps = 0;
  std::uint64_t readmitted_after_fenced_load = 0;  // admitted again after a preemption fenced its load
  std::vector<std::string> load_failures;  // each failed load's own cause
  std::vector<std::string> mismatch_details;
};

struct Progress {
  double modeled_seconds = 0;
  std::uint64_t done = 0;
  double measured_seconds = 0;  // of the measured window (0 during the warm-up)
};

class Engine {
 public:
  Engine(EngineConfig config, Workload workload);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Runs the closed loop on this thread until `warmup` requests have
  // finished and then `seconds` of modeled time have passed (or, with
  // `max_requests`, that many have finished). Throws FailStop /
  // std::runtime_error for what the engine cannot continue from.
  RunStats run(std::uint32_t warmup, double seconds, std::uint64_t max_requests = 0,
               std::function<void(const Progress&)> progress = {});

  // Compares every checkpoint the HBM cache holds with the state a full
  // recompute has at that boundary (F6, F7): returns the mismatches and
  // adds the number checked to stats.
  std::uint64_t verify_checkpoints(RunStats& stats);

  // Null when the configuration has no tier.
  Connector* connector();

  // What run() had counted so far; after run() threw, what happened before.
  const RunStats& stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvstrand::engine
