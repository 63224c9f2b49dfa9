// The example engine (examples/engine) with kvstrand embedded: resumed
// requests equal a full recompute of the same prompt (KV of every plane, the
// recurrent state, the output tokens) through preemption, failed loads,
// stale load outcomes and a server restart; a restart against a warm node
// tier resumes from HBM after one pass; checkpoints hold exactly the
// committed positions; a working set that fits HBM pays nothing for the
// tier (F4, F6, F7, F30, F31).
#include <signal.h>

#include <map>
#include <thread>

#include <kvstrand/sim.hpp>

#include "curl.hpp"
#include "engine.hpp"
#include "kv_pool.hpp"
#include "server_process.hpp"

using namespace kvstrand;
using namespace kvstrand::engine;
using namespace kvstrand::test;
using namespace std::chrono_literals;

namespace {

// A small geometry: 16-token blocks in 64-token chunks, so HBM hits end
// mid-chunk and loads enter chunks part-way.
EngineConfig small_config(bool tier) {
  EngineConfig c;
  c.layout.model_id = "toy-test";
  c.layout.layout_name = "toy-test";
  c.layout.planes = {{"k", 16 * 32}, {"v", 16 * 48}};
  c.layout.block_tokens = 16;
  c.layout.chunk_tokens = 64;
  c.layout.checkpoint = {"swa-ring+cursor", 4096, 64};
  c.layout.dtype = "bf16";
  c.pool_blocks = 400;
  c.concurrency = 4;
  c.max_batched_tokens = 256;
  c.tier = tier;
  c.tier_bytes = 64ull << 20;
  c.time_scale = 0;
  c.min_load_tokens = 64;
  return c;
}

Workload small_workload(std::uint32_t distinct) {
  Workload w;
  w.prefixes = 2;
  w.prefix_tokens = 256;
  w.tail_tokens = 200;
  w.tail_spread = 100;
  w.distinct = distinct;
  w.output_tokens = 8;
  return w;
}

// The engine reaches kvstrand through libkvstrand.so alone, and so does
// this test: a device is one the public API can open a stream on.
bool device_present() {
  try {
    (void)DeviceStream::create();
    return true;
  } catch (const std::exception& e) {
    WARN("skipped: no device for the " << backend() << " backend on this machine: " << e.what());
    return false;
  }
}

bool sim_hooks_present() {
  if (sim::available()) return true;
  WARN("skipped: needs the sim backend's injection hooks (this build: " << backend() << ")");
  return false;
}

void require_exact(const RunStats& st) {
  for (const auto& d : st.mismatch_details) INFO("mismatch: " << d);
  REQUIRE(st.mismatches == 0);
  REQUIRE(st.verified > 0);
}

}  // namespace

TEST_CASE("engine: resumed requests equal a full recompute, from HBM and the tier, under preemption",
          "[engine][gpu]") {
  if (!device_present()) return;
  auto c = small_config(true);
  c.pool_blocks = 95;  // four requests fit their prompts, not their 48 outputs each
  c.reserve_outputs = false;
  auto w = small_workload(24);
  w.output_tokens = 48;
  Engine e(c, w);
  RunStats st = e.run(0, 1e9, 120);
  require_exact(st);
  REQUIRE(st.loads > 0);
  REQUIRE(st.preemptions > 0);
  REQUIRE(st.resumed > 0);
  REQUIRE(e.verify_checkpoints(st) == 0);
}

TEST_CASE("engine: staging memory is reused only after the copies out of it ran", "[engine][sim][fault]") {
  if (!sim_hooks_present()) return;
  // Every copy on the engine's stream waits, so an admission's state image is
  // still queued when the step starts writing KV into the staging area. The
  // image it would corrupt is rewritten before anyone reads it, so it is the
  // ThreadSanitizer run (make test-tsan, in CI) that sees the overwrite: it
  // failed there before the step kept its staging until its copies ran.
  auto c = small_config(false);
  c.sim_stream_delay = std::chrono::microseconds(300);
  Engine e(c, small_workload(6));
  require_exact(e.run(0, 1e9, 12));
}

TEST_CASE("kv pool: a hash's save source is a block that still holds it (F3)", "[engine][pool][gpu]") {
  if (!device_present()) return;
  const auto c = small_config(false);
  KvPool pool(c.layout, 8, 1, 4, true);
  kv::Digest h{};
  h[0] = std::byte{7};
  const kv::BlockId cached = pool.allocate(1)->front();
  pool.commit(cached, h);  // cached under h
  const kv::BlockId twin = pool.allocate(1)->front();
  pool.commit(twin, h);  // a second request computed the same prefix: the latest committer
  REQUIRE(pool.committed().committed(h) == twin);
  pool.release(twin);  // the duplicate goes back to the free list, its bytes up for reuse...
  REQUIRE(pool.committed().committed(h) == cached);  // ...so the cached block is the source again
  pool.release(cached);  // unreferenced but cached: still a valid source
  REQUIRE(pool.committed().committed(h) == cached);
  auto all = pool.allocate(8);  // evicts it
  REQUIRE(all.has_value());
  REQUIRE_FALSE(pool.committed().committed(h).has_value());
}

TEST_CASE("kv pool: a cached block a save leases is not reused while leased", "[engine][pool][gpu]") {
  if (!device_present()) return;
  const auto c = small_config(false);
  KvPool pool(c.layout, 4, 1, 4, true);
  kv::Digest h{};
  h[0] = std::byte{9};
  const kv::BlockId b = pool.allocate(1)->front();
  pool.commit(b, h);
  pool.release(b);  // cached, unreferenced
  const auto lease = pool.leases().lease(std::vector<kv::BlockId>{b});  // a save reads it now
  REQUIRE_FALSE(pool.allocate(4).has_value());  // three are free; the fourth is being read
  const auto three = pool.allocate(3);
  REQUIRE(three.has_value());
  REQUIRE(std::find(three->begin(), three->end(), b) == three->end());
  pool.returned(pool.leases().release(lease));
  for (kv::BlockId x : *three) pool.release(x);
  REQUIRE(pool.allocate(4).has_value());  // released: usable again
}

TEST_CASE("engine: a load outcome of an older generation is ignored, whatever its slot says (F4)",
          "[engine][gpu][fault]") {
  if (!device_present()) return;
  auto c = small_config(true);
  c.pool_blocks = 150;  // the tails do not all stay in HBM: the tier serves them
  c.preempt_loading_every = 2;  // preempt loading requests again and again
  Engine e(c, small_workload(24));
  RunStats st = e.run(0, 1e9, 60);
  require_exact(st);
  REQUIRE(st.preemptions > 0);
  REQUIRE(st.stale_outcomes > 0);
  // The schedule F4 is about, a request preempted while loading admitted
  // again, happens; that it then posts a new load before its old outcome is
  // read cannot: it loads at most once, and the fenced outcome is drained
  // before any admission (run() throws logic_error if either breaks). The
  // old outcome meets the filter as that of a request no longer loading.
  REQUIRE(st.readmitted_after_fenced_load > 0);
}

TEST_CASE("engine: a preemption whose fence times out is fail-stop: the request's blocks are never freed (F1)",
          "[engine][sim][fault]") {
  if (!device_present() || !sim_hooks_present()) return;
  auto c = small_config(true);
  c.pool_blocks = 150;          // the tier serves the tails: loads happen
  c.preempt_loading_every = 1;  // and a loading request is preempted at once
  c.fence_timeout = 100ms;
  c.transfer_deadline = 2s;  // bounds the close after the test
  Engine e(c, small_workload(24));
  REQUIRE(e.connector() != nullptr);
  // Saves go on; every load's copy waits on its held stream: the first
  // preemption's fence cannot cover its load.
  const NativeStream loads = sim::load_stream(*e.connector());
  sim::hold_stream(loads);
  REQUIRE_THROWS_AS(e.run(0, 1e9, 80), FailStop);
  sim::release_stream(loads);
  INFO("loads " << e.stats().loads << ", preemptions " << e.stats().preemptions);
  REQUIRE(e.stats().loads > 0);
  REQUIRE(e.stats().preemptions == 0);  // the preemption stopped before freeing the blocks
}

TEST_CASE("engine: every checkpoint holds the state after exactly its committed tokens (F6, F7)", "[engine][gpu]") {
  if (!device_present()) return;
  Engine e(small_config(false), small_workload(8));
  RunStats st = e.run(0, 1e9, 24);
  REQUIRE(e.verify_checkpoints(st) == 0);
  REQUIRE(st.checkpoints_checked > 10);
}

TEST_CASE("engine: configurations it cannot serve are refused, naming the option (F7)", "[engine]") {
  const Workload w = small_workload(4);
  auto c = small_config(false);
  c.max_batched_tokens = 32;  // below one chunk: no checkpoint could land on the grid
  auto err = validate(c, w);
  REQUIRE(err.has_value());
  REQUIRE(err->option == "max_num_batched_tokens");
  c = small_config(false);
  c.layout.checkpoint = {};
  REQUIRE(validate(c, w)->option == "layout.checkpoint");
  c = small_config(false);
  c.pool_blocks = 10;
  REQUIRE(validate(c, w)->option == "pool_blocks");
  c = small_config(false);
  c.layout.checkpoint.interval_tokens = 32;
  REQUIRE(validate(c, w).has_value());
  REQUIRE_THROWS_AS(Engine(c, w), std::invalid_argument);
}

TEST_CASE("engine: a failed load reports its own cause and the request is recomputed exactly (F30)",
          "[engine][gpu][fault]") {
  if (!device_present() || !sim_hooks_present()) return;
  auto c = small_config(true);
  c.pool_blocks = 150;
  Engine e(c, small_workload(24));
  REQUIRE(e.connector() != nullptr);
  // The first load's first copy runs and fails on the tier's load stream:
  // one group's (the target's or the draft cache's); the other group's copy
  // lands, and the load as a whole fails and is recomputed.
  REQUIRE(c.draft_cache);
  sim::fail_copies(sim::load_stream(*e.connector()), 1);
  RunStats st = e.run(0, 1e9, 80);
  require_exact(st);
  REQUIRE(st.loads_failed == 1);
  REQUIRE(st.load_failures.size() == 1);
  for (const auto& f : st.load_failures) {
    INFO(f);
    REQUIRE(f.find("injected") != std::string::npos);  // the real cause, not a later symptom
  }
  REQUIRE(st.loads > st.loads_failed);  // later loads land
}

TEST_CASE("engine: the draft model's cache is a second registration, stored, loaded and verified with the target's",
          "[engine][gpu]") {
  if (!device_present()) return;
  // HBM too small for the working set: requests resume from the tier.
  auto run = [](bool draft) {
    auto c = small_config(true);
    c.draft_cache = draft;
    c.pool_blocks = 150;
    c.debug_port = 0;  // the tier's object count, from its /metrics
    Engine e(c, small_workload(24));
    RunStats st = e.run(0, 1e9, 80);
    require_exact(st);  // with the draft cache: its KV of every resumed request too
    const std::string metrics = curl(e.connector()->debug_port(), "/metrics").body;
    const std::string gauge = "\nkvstrand_tier_objects ";
    const auto at = metrics.find(gauge);
    INFO(metrics);
    REQUIRE(at != std::string::npos);
    return std::pair{st, std::stoull(metrics.substr(at + gauge.size()))};
  };
  if (!curl_present()) return;
  const auto [with, with_objects] = run(true);
  const auto [without, without_objects] = run(false);
  REQUIRE(with.loads > 0);
  REQUIRE(with.loads_failed == 0);
  REQUIRE(with.verified > 0);
  // Every stored chunk of the target has its draft twin: twice the objects.
  REQUIRE(without_objects > 0);
  REQUIRE(with_objects == 2 * without_objects);
}

TEST_CASE("engine: a working set that fits HBM pays nothing for the tier (F31)", "[engine][gpu]") {
  if (!device_present()) return;
  const Workload w = small_workload(6);
  // One prompt's lookup answers come late, as they do when the scheduler
  // stalls the reactor while the step thread runs on (CI's load did): its
  // requests ask the tier until one of them has computed it, past the
  // warm-up, and only they may. A warm-up of so many requests is no proof
  // that every prompt is in HBM; a request arriving after its prompt's
  // first finish is.
  constexpr std::uint32_t late_prompt = 5;
  auto run = [&](bool tier) {
    auto c = small_config(tier);
    c.hold_lookup_answers = {late_prompt, 18};
    Engine e(c, w);
    RunStats st = e.run(12, 20.0);  // warm-up: 12 requests done
    std::uint64_t n = 0;
    for (const auto& r : st.done) n += r.finish > st.warm_at;
    return std::pair{st, static_cast<double>(n) / (st.end_at - st.warm_at)};
  };
  const auto [hbm, hbm_rate] = run(false);
  const auto [tier, tier_rate] = run(true);
  INFO("hbm " << hbm_rate << " req/s, tier " << tier_rate << " req/s (modeled; the demo's fit arms measure it)");
  REQUIRE(tier.loads == 0);
  std::map<std::uint32_t, double> first_finish;  // prompt -> when HBM first held it (done is in completion order)
  for (const auto& r : tier.done) first_finish.try_emplace(r.prompt, r.finish);
  std::uint64_t covered = 0, late_looked_up = 0, late_measured_looked_up = 0;
  for (const auto& r : tier.done) {
    if (r.arrival > first_finish.at(r.prompt)) {
      ++covered;
      INFO("request " << r.n << " (prompt " << r.prompt << ") arrived after its prompt was computed");
      REQUIRE_FALSE(r.looked_up);  // HBM covers what the tier could add: no lookup, no deferral
    }
    late_looked_up += r.prompt == late_prompt && r.looked_up;
    late_measured_looked_up += r.prompt == late_prompt && r.looked_up && r.finish > tier.warm_at;
  }
  REQUIRE(covered > tier.done.size() / 2);
  REQUIRE(late_looked_up >= 2);  // the held answers kept that prompt out of HBM for a second request
  // The case CI hit: a request measured after the warm-up asked the tier,
  // rightly, since its prompt was not yet computed.
  REQUIRE(late_measured_looked_up >= 1);
  // The same work, request for request: every measured request resumed
  // from HBM exactly as far as without the tier, and computed the same.
  // (The rates also hold the real time spent in kvstrand calls, so they
  // are a benchmark's figure, not this test's.)
  auto measured = [](const RunStats& st) {
    std::map<std::uint32_t, std::pair<std::uint32_t, std::uint32_t>> by_prompt;  // prompt -> (hbm, computed)
    for (const auto& r : st.done)
      if (r.finish > st.warm_at) by_prompt[r.prompt] = {r.hbm_tokens, r.computed_tokens};
    return by_prompt;
  };
  REQUIRE(!measured(hbm).empty());
  REQUIRE(measured(tier) == measured(hbm));
}

TEST_CASE("engine: a server restart mid-run costs recomputes, never a wrong byte", "[engine][server][gpu][fault]") {
  if (!device_present()) return;
  auto srv = std::make_unique<ServerProcess>(std::vector<std::string>{"--tier-bytes", "64M", "--chunk-tokens", "64"});
  REQUIRE(ready_and_full(*srv));
  const std::string path = srv->socket_path();
  auto c = small_config(true);
  c.server_socket = path;
  c.pool_blocks = 150;
  c.time_scale = 0.05;  // about 3 s of real time for the run below
  Engine e(c, small_workload(24));
  RunStats st;
  // Joined on every way out: a failed REQUIRE below must not leave it running
  // (std::terminate, and a server it started holding CTest's output open).
  std::jthread engine([&] { st = e.run(4, 60.0); });
  std::this_thread::sleep_for(1s);
  srv->kill(SIGKILL);
  std::this_thread::sleep_for(300ms);
  srv->restart(std::vector<std::string>{"--tier-bytes", "64M", "--chunk-tokens", "64"});
  REQUIRE(ready_and_full(*srv));
  engine.join();
  require_exact(st);
  REQUIRE(st.saves_failed + st.loads_failed > 0);  // the outage was seen
  REQUIRE(st.loads > st.loads_failed);             // and the tier served again after it
}

TEST_CASE("engine: restarted against a warm node tier, loaded checkpoints join HBM's cache: the next pass loads nothing",
          "[engine][server][gpu]") {
  if (!device_present()) return;
  ServerProcess srv({"--tier-bytes", "64M", "--chunk-tokens", "64"});
  REQUIRE(ready_and_full(srv));  // the first engine's saves all find room
  auto c = small_config(true);
  c.server_socket = srv.socket_path();
  const Workload w = small_workload(6);
  {
    Engine first(c, w);
    const RunStats filled = first.run(w.distinct, 0);  // one pass: the tier holds the working set
    REQUIRE(filled.saves_failed == 0);
  }
  Engine restarted(c, w);  // a fresh engine (empty HBM) on the warm tier
  RunStats st = restarted.run(0, 1e9, 4 * w.distinct);
  require_exact(st);
  REQUIRE(st.loads > 0);  // its first pass came from the tier
  // HBM holds every prompt and, with the fix, the checkpoint each load
  // brought: from the third pass on (the second may meet a first-pass twin
  // still loading), no request loads anything.
  std::uint64_t later = 0;
  for (const auto& r : st.done) {
    if (r.n <= 2 * w.distinct) continue;
    ++later;
    INFO("request " << r.n << " (prompt " << r.prompt << ") loaded " << r.tier_tokens << " tokens");
    REQUIRE(r.tier_tokens == 0);
    REQUIRE(r.hbm_tokens == r.ceiling);
  }
  REQUIRE(later > 0);
  REQUIRE(restarted.verify_checkpoints(st) == 0);
}

TEST_CASE("engine: with no server at all, a request's failed save is not posted again: each gives the tier up once",
          "[engine][server][fault]") {
  if (!device_present()) return;
  auto c = small_config(true);
  c.server_socket = ServerProcess::fresh_socket_path();  // nobody there, for the whole run
  Engine e(c, small_workload(24));
  const RunStats st = e.run(4, 60.0);
  require_exact(st);
  INFO("saves " << st.saves << " failed " << st.saves_failed << " requests " << st.done.size() << " steps "
                 << st.steps);
  // Before: the range of a failed save stayed open and was posted again at
  // every step for as long as the outage lasted.
  REQUIRE(st.saves_failed > 0);
  // At most twice a request (the save in flight when it finished, and its
  // tail save posted after that one; those still running at the end
  // included), not once per step: 4.6 a request before.
  REQUIRE(st.saves_failed <= 2 * (st.done.size() + c.concurrency));
}
