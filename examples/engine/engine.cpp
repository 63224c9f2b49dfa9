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

std::optional<kv::ConfigError> validate(const EngineConfig& c, const Workload& w) {
  if (auto e = kv::validate(c.layout)) return e;
  if (auto e = kv::validate_budget(c.layout, c.max_batched_tokens)) return e;
  if (!c.layout.has_state())
    return kv::ConfigError{"layout.checkpoint", "the toy model keeps recurrent state: it needs a checkpoint image"};
  if (c.concurrency == 0) return kv::ConfigError{"concurrency", "must be > 0"};
  const std::uint32_t per_request =
      (w.max_prompt_tokens() + w.output_tokens + c.layout.block_tokens - 1) / c.layout.block_tokens;
  if (c.pool_blocks < per_request)
    return kv::ConfigError{"pool_blocks", std::to_string(c.pool_blocks) + " blocks cannot hold one request (" +
                                              std::to_string(per_request) + " blocks)"};
  if (c.time_scale < 0) return kv::ConfigError{"time_scale", "must be >= 0"};
  if (w.output_tokens == 0) return kv::ConfigError{"output_tokens", "must be > 0"};
  return std::nullopt;
}

namespace {

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

constexpr std::uint64_t kDraftSalt = 0xd4af7ull;  // the draft model's KV differs from the target's

// The draft model's layout: the target's geometry and tokens, one plane of
// half the target's first plane's bytes per token, no recurrent state.
kv::Layout draft_layout_of(const kv::Layout& target) {
  kv::Layout l = target;
  l.model_id = target.model_id + "-draft";
  l.layout_name = "draft";
  const std::uint64_t per_token = std::max<std::uint64_t>(1, target.planes.at(0).bytes_per_block / target.block_tokens / 2);
  l.planes = {{"draft-kv", per_token * target.block_tokens}};
  l.checkpoint = {};
  l.sliding_window = 0;
  l.speculative = {};
  return l;
}

}  // namespace

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

  Impl(EngineConfig c, Workload w)
      : cfg(std::move(c)), work(w), model(cfg.layout),
        pool(cfg.layout, cfg.pool_blocks, cfg.concurrency,
             cfg.checkpoint_slots ? cfg.checkpoint_slots : cfg.pool_blocks / cfg.layout.blocks_per_chunk(),
             cfg.hbm_cache),
        ns(kv::namespace_of(cfg.layout)), stream(DeviceStream::create()) {
    std::uint64_t per_token = 0;
    for (std::size_t p = 0; p < cfg.layout.planes.size(); ++p) per_token += model.bytes_per_token(p);
    if (cfg.draft_cache) {
      draft_layout.emplace(draft_layout_of(cfg.layout));
      draft_model.emplace(*draft_layout);
      draft_plane.emplace(
          DeviceMemory::allocate(std::uint64_t{cfg.pool_blocks} * draft_layout->planes[0].bytes_per_block));
      draft_ns = kv::namespace_of(*draft_layout);
      per_token += draft_model->bytes_per_token(0);
    }
    const std::uint64_t tokens = cfg.max_batched_tokens + 2ull * cfg.concurrency;
    half_bytes =
        tokens * per_token + (tokens / cfg.layout.chunk_tokens + 2 * cfg.concurrency + 2) * cfg.layout.checkpoint.image_bytes;
    staging.emplace(HostMemory::allocate(2 * half_bytes));
    if (cfg.sim_stream_delay.count() > 0) sim::set_stream_delay(stream.native(), cfg.sim_stream_delay);
    if (cfg.tier) {
      ConnectorOptions o;
      o.transfer_deadline = cfg.transfer_deadline;
      o.tier_bytes = cfg.tier_bytes;
      o.server_socket = cfg.server_socket;
      o.server_request_timeout = std::chrono::milliseconds(5000);
      o.debug_port = cfg.debug_port;
      o.debug_address = cfg.debug_address;
      conn = std::make_unique<Connector>(o);
      conn->register_layout(pool.registration());
      if (draft_layout) {
        Registration draft;
        draft.layout = *draft_layout;
        draft.planes = {{draft_plane->data(), cfg.pool_blocks}};
        draft_reg = conn->register_layout(draft);
      }
    }
  }

  // Copies out of the staging area may still be queued (no step waits for
  // its own): they run before the staging area is freed.
  ~Impl() {
    try {
      stream.synchronize();
    } catch (const std::exception& e) {
      spdlog::error("engine: the stream's last copies: {}", e.what());
    }
  }

  // ---- device writes through the step's staging area ----------------------

  std::byte* stage(std::size_t n) {
    if (staged + n > half_bytes) {  // full: let every queued copy drain, start over
      stream.synchronize();
      staged = 0;
    }
    std::byte* p = staging->data() + side * half_bytes + staged;
    staged += n;
    return p;
  }

  // What a transfer posted now waits for: everything queued on the
  // engine's stream so far (a save: the step's writes of its blocks; a
  // load: every write queued to blocks that may have been another
  // request's). kvstrand records its own event there at the post.
  Producer engine_point() const { return Producer::after_stream(stream.native()); }

  // The end of a step's device work: its staging half is free once it has run.
  void end_step() {
    if (!half_done[side]) half_done[side].emplace(DeviceEvent::create());
    half_done[side]->record(stream);
    side ^= 1;
    staged = 0;
    if (half_done[side]) half_done[side]->synchronize();  // two steps old
  }
  void write_image(std::int32_t slot, const ToyState& s) {
    const auto img = model.image(s);
    std::byte* p = stage(img.size());
    std::memcpy(p, img.data(), img.size());
    pool.state().write_async(pool.slot_offset(slot), {p, img.size()}, stream);
  }
  ToyState read_image(std::int32_t slot) {
    const std::uint64_t n = cfg.layout.checkpoint.image_bytes;
    auto& buf = readback_buffer(n);
    pool.state().read_async(pool.slot_offset(slot), {buf.data(), n}, stream);
    stream.synchronize();
    ToyState s;
    if (!ToyModel::from_image({buf.data(), n}, &s)) s.cursor = ~0ull;  // garbage: the verify step says so
    return s;
  }
  HostMemory& readback_buffer(std::uint64_t n) {
    if (!readback || readback->size() < n) readback.emplace(HostMemory::allocate(n));
    return *readback;
  }

  // Computes tokens [a, b) into the table; seq[u - a] is token u.
  void compute(Request& r, std::uint32_t a, std::uint32_t b, const std::uint32_t* seq) {
    const auto& l = cfg.layout;
    std::uint32_t t = a;
    while (t < b) {
      const std::uint32_t block = t / l.block_tokens;
      const std::uint32_t end = std::min(b, (block + 1) * l.block_tokens);
      const std::uint32_t off = t % l.block_tokens;
      std::vector<std::byte*> dst(l.planes.size());
      for (std::size_t p = 0; p < l.planes.size(); ++p) dst[p] = stage((end - t) * model.bytes_per_token(p));
      const std::uint64_t dbpt = draft_model ? draft_model->bytes_per_token(0) : 0;
      std::byte* draft_dst = draft_model ? stage((end - t) * dbpt) : nullptr;
      for (std::uint32_t u = t; u < end; ++u) {
        const std::uint64_t h = ToyModel::advance(r.state, seq[u - a]);
        for (std::size_t p = 0; p < l.planes.size(); ++p)
          model.token_kv(h, p, dst[p] + (u - t) * model.bytes_per_token(p));
        if (draft_model) draft_model->token_kv(h ^ kDraftSalt, 0, draft_dst + (u - t) * dbpt);
        // A checkpoint at every chunk end of the prompt, taken now: after
        // exactly the committed tokens, before the state moves on (F6, F7).
        if ((u + 1) % l.chunk_tokens == 0 && u + 1 <= r.prompt()) {
          const kv::Digest& hash = r.block_hashes[(u + 1) / l.block_tokens - 1];
          if (!pool.checkpoint(hash))
            if (auto s = pool.checkpoint_slot_for(hash)) write_image(*s, r.state);
        }
      }
      const kv::BlockId dev = r.table[block];
      for (std::size_t p = 0; p < l.planes.size(); ++p)
        pool.plane(p).write_async(dev * l.planes[p].bytes_per_block + off * model.bytes_per_token(p),
                                  {dst[p], (end - t) * model.bytes_per_token(p)}, stream);
      if (draft_model)
        draft_plane->write_async(dev * draft_layout->planes[0].bytes_per_block + off * dbpt, {draft_dst, (end - t) * dbpt},
                                 stream);
      if (end % l.block_tokens == 0 && end <= r.prompt()) pool.commit(dev, r.block_hashes[block]);
      t = end;
    }
  }

  // ---- requests ---------------------------------------------------------------

  void arrive() {
    auto r = std::make_unique<Request>(cfg.layout.chunk_tokens);
    r->n = next_n++;
    r->id = "r" + std::to_string(r->n);
    r->prompt_index = static_cast<std::uint32_t>((r->n - 1) % work.distinct);
    auto& toks = prompts[r->prompt_index];
    if (toks.empty()) toks = work.prompt(r->prompt_index);
    r->tokens = toks;
    r->block_hashes = hasher.hashes(ns, r->tokens, cfg.layout.block_tokens);
    r->keys = kv::chunk_keys(cfg.layout, ns, r->tokens);
    if (draft_layout) r->draft_keys = kv::chunk_keys(*draft_layout, draft_ns, r->tokens);
    r->rec.n = r->n;
    r->rec.prompt = r->prompt_index;
    r->rec.arrival = clock;
    r->rec.prompt_tokens = r->prompt();
    r->rec.ceiling = grid_ceiling(*r);
    waiting.push_back(r->n);
    live[r->n] = std::move(r);
  }

  kv::HitSource hbm_hit(const Request& r) const {
    kv::HitSource h;
    if (!cfg.hbm_cache) return h;
    std::uint32_t blocks = 0;
    while (blocks < r.block_hashes.size() && pool.cached(r.block_hashes[blocks])) ++blocks;
    h.tokens = blocks * cfg.layout.block_tokens;
    for (std::uint32_t c = cfg.layout.chunk_tokens; c <= h.tokens; c += cfg.layout.chunk_tokens)
      if (pool.checkpoint(r.block_hashes[c / cfg.layout.block_tokens - 1])) h.checkpoints.push_back(c);
    return h;
  }

  // The highest frontier any source could give this prompt.
  std::uint32_t grid_ceiling(const Request& r) const {
    const std::uint32_t limit = r.prompt() - cfg.layout.prefill_tail();
    return kv::floor_to(limit, cfg.layout.chunk_tokens);
  }

  // Where a request resumes. With the draft group, both groups are planned
  // together (kv::plan_groups): the draft's blocks mirror the target's, so
  // HBM holds the same tokens of both, and a load must bring both groups'
  // bytes for its blocks: the tier source of each is the least of what the
  // two groups' lookups found (the target's checkpoints within it).
  kv::HitPlan plan_request(const Request& r, kv::HitInputs in) const {
    if (!draft_layout) return kv::plan_hit(cfg.layout, in);
    std::optional<kv::HitSource> draft_tier;
    if (in.tier) {
      const std::uint32_t both = std::min(in.tier->tokens, r.draft_hit ? r.draft_hit->tokens : 0u);
      std::erase_if(in.tier->checkpoints, [both](std::uint32_t c) { return c > both; });
      in.tier->tokens = both;
      draft_tier = kv::HitSource{both, {}};
    }
    const std::vector<kv::GroupHitInputs> groups = {{&cfg.layout, in.hbm, in.tier},
                                                    {&*draft_layout, kv::HitSource{in.hbm.tokens, {}}, draft_tier}};
    return kv::plan_groups(groups, in.prompt_tokens, in.min_load_tokens).groups[0];
  }

  // The tier's answers hold leases (kvstrand-server): given back when no
  // load will name them (F20).
  void release_leases(Request& r) {
    if (r.tier_lease != 0) timed([&] { conn->release_lookup(std::exchange(r.tier_lease, 0)); });
    if (r.draft_lease != 0) timed([&] { conn->release_lookup(std::exchange(r.draft_lease, 0)); });
  }

  // The draft group's transfer of the target spec's tokens and blocks.
  kv::TransferSpec draft_spec(const Request& r, const kv::TransferSpec& target) const {
    const std::uint32_t ct = cfg.layout.chunk_tokens;
    kv::TransferSpec d;
    d.request = target.request;
    d.registration = draft_reg;
    d.tokens = target.tokens;
    const std::uint32_t c0 = target.tokens.begin / ct, c1 = (target.tokens.end + ct - 1) / ct;
    d.keys.assign(r.draft_keys.begin() + c0, r.draft_keys.begin() + c1);
    d.blocks = target.blocks;
    return d;
  }

  // One admission attempt. False: stop admitting this step (no memory).
  bool admit(Request& r) {
    const auto& l = cfg.layout;
    const kv::HitSource hbm = hbm_hit(r);
    kv::HitInputs in;
    in.prompt_tokens = r.prompt();
    in.hbm = hbm;
    in.min_load_tokens = cfg.min_load_tokens;
    if (conn && !r.tracker.tier_attempt_spent()) {
      const kv::HitPlan local = kv::plan_hit(l, in);
      // Ask the tier only when it could add something: a working set that
      // fits HBM pays no lookup (F31).
      if (local.frontier < grid_ceiling(r)) {
        if (!r.lookup_id) {
          r.lookup_id = timed([&] { return conn->lookup(r.keys); });
          r.rec.looked_up = true;
          lookup_owner[*r.lookup_id] = {r.n, false};
          ++stats.lookups;
          if (draft_layout) {
            r.draft_lookup_id = timed([&] { return conn->lookup(r.draft_keys, draft_reg); });
            lookup_owner[*r.draft_lookup_id] = {r.n, true};
          }
        }
        if (!r.lookup_answered || (draft_layout && !r.draft_answered)) {
          ++stats.deferred_steps;
          return true;  // deferred, never waited for
        }
        in.tier = r.tier_hit;
      }
    }
    const kv::HitPlan plan = plan_request(r, in);
    if (std::exchange(r.preempted_loading, false)) {
      ++stats.readmitted_after_fenced_load;
      if (plan.load) throw std::logic_error("engine: " + r.id + " would load again after its load was fenced (F4)");
    }
    if (in.tier) r.tracker.note_stored(in.tier->tokens);
    // The tier's answer holds a lease (kvstrand-server); a hit the plan does
    // not load gives it back now (F20).
    if (!plan.load) release_leases(r);

    const std::uint32_t reused = plan.hbm_tokens / l.block_tokens;
    const std::uint32_t last = r.prompt() + (cfg.reserve_outputs ? work.output_tokens : 1);
    const std::uint32_t need = (last + l.block_tokens - 1) / l.block_tokens;
    std::vector<kv::BlockId> table;
    for (std::uint32_t b = 0; b < reused; ++b) table.push_back(*pool.acquire_cached(r.block_hashes[b]));
    auto fresh = pool.allocate(need - reused);
    if (!fresh) {
      for (kv::BlockId b : table) pool.release(b);
      return false;
    }
    table.insert(table.end(), fresh->begin(), fresh->end());
    r.table = std::move(table);
    r.slot = *pool.take_running_slot();
    slot_owner[r.slot] = {r.n, r.generation};
    r.rec.hbm_tokens = plan.hbm_tokens;
    r.rec.tier_tokens = 0;
    r.rec.load_begin.reset();
    r.outputs.clear();
    running.push_back(r.n);

    if (plan.load) {
      // F4 by construction, twice over: a request loads at most once (its
      // tier attempt is spent when the load is decided, so a request
      // preempted while loading is planned again from HBM alone), and a
      // preemption fences its load, whose outcome the next turn of the loop
      // drains before it admits. A load is never posted while an outcome of
      // the request's previous one is unread; the stale-outcome filter in
      // on_load is the second line.
      for (const auto& [name, in_flight] : loads)
        if (in_flight.request == r.n)
          throw std::logic_error("engine: " + r.id + " would post a new load while the outcome of " + name +
                                 " is unread (F4)");
      kv::TransferSpec s;
      r.load_name = r.id + ".g" + std::to_string(r.generation) + ".load";
      s.request = r.load_name;
      s.tokens = *plan.load;
      const std::uint32_t c0 = plan.load->begin / l.chunk_tokens, c1 = plan.load->end / l.chunk_tokens;
      s.keys.assign(r.keys.begin() + c0, r.keys.begin() + c1);
      std::vector<std::pair<kv::Digest, kv::BlockId>> dests;
      for (std::uint32_t b = plan.load->begin / l.block_tokens; b < plan.load->end / l.block_tokens; ++b) {
        s.blocks.push_back(r.table[b]);
        dests.emplace_back(r.block_hashes[b], r.table[b]);
      }
      s.with_state = true;
      s.state_slots = {r.slot};
      s.tier_lease = std::exchange(r.tier_lease, 0);  // the load ends the lease once it has copied
      std::vector<Op> ops;
      if (draft_layout) {  // the draft group's blocks are the same ids: the same range, its own keys and lease
        kv::TransferSpec d = draft_spec(r, s);
        d.tier_lease = std::exchange(r.draft_lease, 0);
        ops.push_back({TransferKind::load, std::move(d), {}});
      }
      const std::uint64_t id = load_seq++;
      pool.committed().record_load(id, std::move(dests));
      r.tracker.load_decided(*plan.load);
      r.computed = plan.hbm_tokens;
      r.rec.tier_tokens = plan.load->size();
      r.rec.load_begin = plan.load->begin;
      r.phase = Request::Phase::loading;
      LoadInFlight& in_flight = loads[r.load_name] = LoadInFlight{};
      in_flight.request = r.n;
      in_flight.record = id;
      in_flight.outcomes_left = 1 + static_cast<int>(ops.size());
      // The blocks it writes may have been another request's until now:
      // the load waits for every write the engine queued to them.
      ops.insert(ops.begin(), Op{TransferKind::load, std::move(s), {}});
      for (auto& op : ops) op.producer = engine_point();
      timed([&] { conn->submit(std::move(ops)); });
      ++stats.loads;
      if (plan.load->begin == 0) ++stats.loads_from_zero;
      return true;
    }
    // No load: resume from HBM's checkpoint at the frontier, or from scratch.
    r.computed = plan.frontier;
    if (plan.frontier == 0) {
      r.state = ToyState{};
      write_image(r.slot, r.state);
    } else {
      const auto src = pool.checkpoint(r.block_hashes[plan.frontier / l.block_tokens - 1]);
      pool.state().copy_async(pool.slot_offset(r.slot), pool.state(), pool.slot_offset(*src), l.checkpoint.image_bytes,
                              stream);
      r.state = read_image(r.slot);  // the device's copy is the state
    }
    r.rec.resumed = plan.frontier > 0;
    r.phase = Request::Phase::running;
    return true;
  }

  // The Connector's fence, co_awaited from this loop: its completion runs on
  // kvstrand's reactor thread and only posts the result here. The exception
  // is moved, never copied, so this thread holds its last reference.
  asio::awaitable<void> fence(std::vector<std::string> requests) {
    // The wait counts as work: run() must not return while the fence is out.
    auto ex = asio::prefer(co_await asio::this_coro::executor, asio::execution::outstanding_work.tracked);
    auto start = [this, ex, requests = std::move(requests)](auto handler) mutable {
      auto h = std::make_shared<decltype(handler)>(std::move(handler));
      conn->fence_async(std::move(requests), cfg.fence_timeout, [ex, h](std::exception_ptr e) {
        asio::post(ex, [h, e = std::move(e)]() mutable { std::move (*h)(std::move(e)); });
      });
    };
    // use_awaitable rethrows a non-null exception_ptr here.
    co_await asio::async_initiate<decltype(asio::use_awaitable), void(std::exception_ptr)>(start, asio::use_awaitable);
  }

  // Frees what a running request holds and puts it back at the front of the
  // queue, a new generation. A load into its blocks is fenced first; a fence
  // that cannot cover it throws FailStop out of the step loop before any
  // block is freed: a copy may still write them (fail-stop, F1).
  asio::awaitable<void> preempt(Request& r) {
    if (r.phase == Request::Phase::loading) {
      std::vector<std::string> names{r.load_name};
      co_await fence(std::move(names));
      // Its outcome, still in the mailbox, names the old generation: ignored.
      settle_record(loads.at(r.load_name), false);
      r.tracker.load_settled(kv::LoadOutcome::failed);
      r.preempted_loading = true;
    }
    release_request(r);
    ++r.generation;
    ++r.rec.preemptions;
    ++stats.preemptions;
    r.phase = Request::Phase::waiting;
    r.computed = 0;
    r.outputs.clear();
    r.stamped = 0;
    waiting.push_front(r.n);
  }

  // The image in the request's slot is the state after exactly `end`
  // committed tokens, a chunk end whose blocks HBM now caches: it becomes
  // HBM's checkpoint there, as a computed one would (F6, F7), so the next
  // request on this prefix resumes from HBM instead of loading the chunk
  // again. The slot budget and eviction with the blocks are the pool's.
  void keep_checkpoint(const Request& r, std::uint32_t end) {
    const auto& l = cfg.layout;
    if (end == 0 || end % l.chunk_tokens != 0 || end > r.prompt()) return;
    const kv::Digest& hash = r.block_hashes[end / l.block_tokens - 1];
    if (!pool.cached(hash) || pool.checkpoint(hash)) return;
    if (auto s = pool.checkpoint_slot_for(hash))
      pool.state().copy_async(pool.slot_offset(*s), pool.state(), pool.slot_offset(r.slot), l.checkpoint.image_bytes,
                              stream);
  }

  void settle_record(LoadInFlight& l, bool landed) {
    if (l.settled) return;
    pool.committed().load_settled(l.record, landed);
    l.settled = true;
  }

  void release_request(Request& r) {
    for (kv::BlockId b : r.table) pool.release(b);
    r.table.clear();
    slot_owner.erase(r.slot);
    pool.free_running_slot(r.slot);
    r.slot = -1;
    running.remove(r.n);
  }

  // ---- completions --------------------------------------------------------------

  // The lookup answers to act on now: all of them, unless a test holds one
  // prompt's (cfg.hold_lookup_answers).
  std::vector<LookupOutcome> answers_due(std::vector<LookupOutcome> arrived) {
    const auto& hold = cfg.hold_lookup_answers;
    if (hold.until_done == 0 || (held_answers.empty() && arrived.empty())) return arrived;
    arrived.insert(arrived.end(), held_answers.begin(), held_answers.end());
    held_answers.clear();
    std::vector<LookupOutcome> due;
    for (auto& lk : arrived) {
      const auto owner = lookup_owner.find(lk.id);
      const auto r = owner == lookup_owner.end() ? live.end() : live.find(owner->second.first);
      const bool held = r != live.end() && r->second->prompt_index == hold.prompt && stats.done.size() < hold.until_done;
      (held ? held_answers : due).push_back(std::move(lk));
    }
    return due;
  }

  void drain() {
    if (!conn) return;
    Finished f = timed([&] { return conn->finished(); });
    for (const auto& lk : answers_due(std::move(f.lookups))) {
      auto it = lookup_owner.find(lk.id);
      if (it == lookup_owner.end()) continue;
      if (auto r = live.find(it->second.first); r != live.end()) {
        Request& q = *r->second;
        (it->second.second ? q.draft_answered : q.lookup_answered) = true;
        (it->second.second ? q.draft_hit : q.tier_hit) = lk.hit;
        (it->second.second ? q.draft_lease : q.tier_lease) = lk.lease;
      } else {
        conn->release_lookup(lk.lease);
      }
      lookup_owner.erase(it);
    }
    for (const auto& o : f.loads) on_load(o);
    for (const auto& o : f.saves) {
      auto it = saves.find(o.request);
      if (it == saves.end()) continue;
      if (!o.ok) spdlog::debug("engine: save {} (registration {}) failed: {}", o.request, o.registration, o.reason);
      it->second.ok = it->second.ok && o.ok;
      if (--it->second.outcomes_left > 0) continue;  // the other group's is still to come
      ++stats.saves;
      if (!it->second.ok) ++stats.saves_failed;
      if (auto r = live.find(it->second.request); r != live.end()) {
        r->second->tracker.save_settled(it->second.ok);
        // The tier refused or was unreachable (a server restarting): the
        // request goes on without it. Retried, its range would be posted
        // again at every step for as long as the outage lasts.
        if (!it->second.ok) r->second->tracker.abandon(r->second->prompt());
      }
      if (auto t = tails.find(it->second.request); t != tails.end()) {  // the finished request's last save
        post(it->second.request, std::move(t->second.specs), std::move(t->second.pinned));
        tails.erase(t);
      }
      for (std::int32_t s : it->second.pinned) pool.unpin_slot(s);
      it->second.pinned.clear();
      it->second.settled = true;
      if (it->second.safe) saves.erase(it);
    }
    for (const auto& s : f.source_safe) {
      auto it = saves.find(s.request);
      if (it == saves.end()) continue;
      if (--it->second.unsafe_left > 0) continue;  // the other group's copy may still read the blocks
      pool.returned(pool.leases().release(it->second.lease));
      it->second.safe = true;
      if (it->second.settled) saves.erase(it);
    }
  }

  void on_load(const TransferOutcome& outcome) {
    auto entry = loads.find(outcome.request);
    if (entry == loads.end()) return;
    // Every group's outcome first: the load landed only if each group's did.
    entry->second.ok = entry->second.ok && outcome.ok;
    if (!outcome.ok && entry->second.reason.empty()) entry->second.reason = outcome.reason;
    if (--entry->second.outcomes_left > 0) return;
    LoadInFlight load = entry->second;
    loads.erase(entry);
    TransferOutcome o = outcome;
    o.ok = load.ok;
    o.reason = load.reason;
    const std::uint64_t n = load.request;
    auto it = live.find(n);
    // A stale outcome: the request was preempted (new generation) since,
    // and its slot may belong to someone else now. Ownership is by request
    // and generation, never by what the slot's cursor says (F4).
    if (it == live.end() || it->second->load_name != o.request || it->second->phase != Request::Phase::loading ||
        slot_owner[it->second->slot] != std::make_pair(n, it->second->generation)) {
      settle_record(load, false);  // its destinations were given up (preemption fenced it)
      ++stats.stale_outcomes;
      return;
    }
    Request& r = *it->second;
    settle_record(load, o.ok);
    if (o.ok) {
      r.tracker.load_settled(kv::LoadOutcome::landed);
      for (std::uint32_t b = o.tokens.begin / cfg.layout.block_tokens; b < o.tokens.end / cfg.layout.block_tokens; ++b)
        pool.commit(r.table[b], r.block_hashes[b]);
      r.computed = o.tokens.end;
      r.state = read_image(r.slot);  // the image the load brought
      keep_checkpoint(r, o.tokens.end);
      r.rec.resumed = true;
      r.phase = Request::Phase::running;
      return;
    }
    // The load failed: say why (its own cause, F30), then recompute. The
    // request goes back to the queue and is planned again from HBM alone.
    ++stats.loads_failed;
    stats.load_failures.push_back(o.request + ": " + o.reason);
    spdlog::warn("engine: load {} failed, recomputing its {} tokens: {}", o.request, o.tokens.size(), o.reason);
    r.tracker.load_settled(kv::LoadOutcome::failed);
    release_request(r);
    ++r.generation;
    r.phase = Request::Phase::waiting;
    r.computed = 0;
    waiting.push_front(r.n);
  }

  // ---- saves ----------------------------------------------------------------------

  void post_saves(Request& r) {
    if (!conn || r.phase != Request::Phase::running || !kv::writes_to_tier(cfg.layout)) return;
    const auto range = r.tracker.next_save(std::min(r.computed, r.prompt()));
    if (!range) return;
    std::vector<std::int32_t> pinned;
    auto specs = build(r, *range, &pinned);
    if (specs.empty()) {
      r.tracker.save_settled(false);
      return;
    }
    post(r.n, std::move(specs), std::move(pinned));
  }

  // The save of `range` of `r`: sources leased, checkpoint slots pinned;
  // with the draft group, its save of the same blocks second. Empty: no
  // committed sources.
  std::vector<kv::TransferSpec> build(Request& r, kv::TokenRange range, std::vector<std::int32_t>* pinned) {
    auto spec = build_target(r, range, pinned);
    if (!spec) return {};
    std::vector<kv::TransferSpec> specs;
    if (draft_layout) specs.push_back(draft_spec(r, *spec));
    specs.insert(specs.begin(), std::move(*spec));
    return specs;
  }

  std::optional<kv::TransferSpec> build_target(Request& r, kv::TokenRange range, std::vector<std::int32_t>* pinned) {
    const auto& l = cfg.layout;
    const std::uint32_t c0 = range.begin / l.chunk_tokens, c1 = range.end / l.chunk_tokens;
    std::vector<kv::ChunkKey> keys(r.keys.begin() + c0, r.keys.begin() + c1);
    std::span<const kv::Digest> hashes(r.block_hashes.data() + range.begin / l.block_tokens,
                                       (range.end - range.begin) / l.block_tokens);
    const std::string name = r.id + ".s" + std::to_string(r.save_seq++);
    auto spec = kv::build_save(name, range, std::move(keys), hashes, true, pool.committed(), pool.leases());
    if (!spec) return std::nullopt;
    for (std::uint32_t c = c0; c < c1; ++c) {
      const auto slot = pool.checkpoint(r.block_hashes[(c + 1) * l.blocks_per_chunk() - 1]);
      spec->state_slots.push_back(slot.value_or(-1));
      if (slot) {
        pool.pin_slot(*slot);
        pinned->push_back(*slot);
      }
    }
    return spec;
  }

  // One save per group, in one submit; the source lease (the target's
  // spec's) is released once every group's copy out of the blocks ended.
  void post(std::uint64_t n, std::vector<kv::TransferSpec> specs, std::vector<std::int32_t> pinned) {
    SaveInFlight in_flight{n, specs.front().lease, std::move(pinned)};
    in_flight.outcomes_left = in_flight.unsafe_left = static_cast<int>(specs.size());
    saves[specs.front().request] = std::move(in_flight);
    std::vector<Op> ops;
    for (auto& s : specs) ops.push_back({TransferKind::save, std::move(s), engine_point()});
    timed([&] { conn->submit(std::move(ops)); });
  }

  // ---- verification -------------------------------------------------------------

  const ToyModel::Reference& reference(std::uint32_t prompt) {
    auto it = references.find(prompt);
    if (it == references.end())
      it = references.emplace(prompt, ToyModel::reference(prompts.at(prompt), work.output_tokens)).first;
    return it->second;
  }

  // A resumed request at the end of its prefill: every prompt KV byte and the
  // state image against a full recompute.
  void verify_prefill(Request& r) {
    const auto& ref = reference(r.prompt_index);
    const auto& l = cfg.layout;
    std::uint64_t per_block = 0;
    for (const auto& p : l.planes) per_block += p.bytes_per_block;
    const std::uint32_t blocks = (r.prompt() + l.block_tokens - 1) / l.block_tokens;
    auto& buf = readback_buffer(std::max<std::uint64_t>(blocks * per_block, l.checkpoint.image_bytes));
    stream.synchronize();
    std::uint64_t off = 0;
    for (std::size_t p = 0; p < l.planes.size(); ++p)
      for (std::uint32_t b = 0; b < blocks; ++b, off += l.planes[p].bytes_per_block)
        pool.plane(p).read_async(r.table[b] * l.planes[p].bytes_per_block, {buf.data() + off, l.planes[p].bytes_per_block},
                                 stream);
    stream.synchronize();
    std::string bad;
    std::vector<std::byte> expect;
    off = 0;
    for (std::size_t p = 0; p < l.planes.size() && bad.empty(); ++p) {
      const std::uint64_t bpt = model.bytes_per_token(p);
      expect.resize(bpt);
      for (std::uint32_t b = 0; b < blocks && bad.empty(); ++b, off += l.planes[p].bytes_per_block)
        for (std::uint32_t u = 0; u < l.block_tokens && b * l.block_tokens + u < r.prompt(); ++u) {
          model.token_kv(ref.hashes[b * l.block_tokens + u], p, expect.data());
          if (std::memcmp(buf.data() + off + u * bpt, expect.data(), bpt) != 0) {
            bad = "KV of token " + std::to_string(b * l.block_tokens + u) + ", plane " + l.planes[p].name;
            break;
          }
        }
    }
    if (bad.empty()) {
      const auto img = model.image(ref.prompt_state);
      pool.state().read_async(pool.slot_offset(r.slot), {buf.data(), img.size()}, stream);
      stream.synchronize();
      if (std::memcmp(buf.data(), img.data(), img.size()) != 0) bad = "state image at the prompt's end";
    }
    if (bad.empty() && draft_model) {  // the draft group's KV, in the same blocks of its own pool
      const std::uint64_t dbpb = draft_layout->planes[0].bytes_per_block, dbpt = draft_model->bytes_per_token(0);
      auto& dbuf = readback_buffer(std::max<std::uint64_t>(blocks * dbpb, blocks * per_block));
      for (std::uint32_t b = 0; b < blocks; ++b)
        draft_plane->read_async(r.table[b] * dbpb, {dbuf.data() + b * dbpb, dbpb}, stream);
      stream.synchronize();
      expect.resize(dbpt);
      for (std::uint32_t t = 0; t < r.prompt() && bad.empty(); ++t) {
        draft_model->token_kv(ref.hashes[t] ^ kDraftSalt, 0, expect.data());
        if (std::memcmp(dbuf.data() + t / l.block_tokens * dbpb + t % l.block_tokens * dbpt, expect.data(), dbpt) != 0)
          bad = "draft KV of token " + std::to_string(t);
      }
    }
    ++stats.verified;
    if (!bad.empty()) mismatch(r, bad);
  }

  void mismatch(const Request& r, const std::string& what) {
    ++stats.mismatches;
    const std::string d = r.id + " (prompt " + std::to_string(r.prompt_index) + "): " + what;
    spdlog::error("engine: resumed request differs from a full recompute: {}", d);
    if (stats.mismatch_details.size() < 20) stats.mismatch_details.push_back(d);
  }

  // ---- the step ----------------------------------------------------------------------

  struct StepWork {
    std::uint64_t prefill_tokens = 0, outputs = 0;
  };

  asio::awaitable<StepWork> step() {
    StepWork w;
    std::uint32_t budget = cfg.max_batched_tokens;
    // Decode first (one token each), then prefill chunks with what is left.
    std::vector<std::uint64_t> order(running.begin(), running.end());
    for (std::uint64_t n : order) {
      auto it = live.find(n);
      if (it == live.end()) continue;
      Request& r = *it->second;
      if (r.phase != Request::Phase::running || r.prefilling() || budget == 0) continue;
      const std::uint32_t pos = r.prompt() + static_cast<std::uint32_t>(r.outputs.size());
      if (pos / cfg.layout.block_tokens >= r.table.size()) {
        auto b = pool.allocate(1);
        while (!b) {  // memory pressure: preempt the newest other request, or this one
          std::uint64_t victim = running.back();
          if (victim == n && running.size() > 1) victim = *std::prev(running.end(), 2);
          co_await preempt(*live.at(victim));
          if (victim == n) break;
          b = pool.allocate(1);
        }
        if (!b) continue;
        r.table.push_back(b->front());
      }
      produce_token(r);
      --budget;
      ++w.outputs;
    }
    for (std::uint64_t n : order) {
      auto it = live.find(n);
      if (it == live.end()) continue;
      Request& r = *it->second;
      if (r.phase != Request::Phase::running || !r.prefilling() || budget == 0) continue;
      const std::uint32_t end = kv::prefill_chunk_end(cfg.layout, r.computed, budget, r.prompt());
      if (end == r.computed) continue;
      compute(r, r.computed, end, r.tokens.data() + r.computed);
      w.prefill_tokens += end - r.computed;
      r.rec.computed_tokens += end - r.computed;
      budget -= end - r.computed;
      r.computed = end;
      if (!r.prefilling()) {
        write_image(r.slot, r.state);
        if (cfg.verify && r.rec.resumed) verify_prefill(r);
        produce_token(r);  // the prefill's last step samples the first token
        ++w.outputs;
      }
    }
    for (std::uint64_t n : order)
      if (auto it = live.find(n); it != live.end() && it->second->phase == Request::Phase::running &&
                                  !it->second->prefilling())
        write_image(it->second->slot, it->second->state);
    end_step();  // saves of this step's KV wait for its event, not for a synchronize
    co_return w;
  }

  void produce_token(Request& r) {
    const std::uint32_t tok = ToyModel::next_token(r.state);
    const std::uint32_t pos = r.prompt() + static_cast<std::uint32_t>(r.outputs.size());
    r.outputs.push_back(tok);
    compute(r, pos, pos + 1, &tok);
  }

  // Called after the step's modeled time is on the clock.
  void stamp_tokens(const StepWork&) {
    std::vector<std::uint64_t> order(running.begin(), running.end());
    for (std::uint64_t n : order) {
      Request& r = *live.at(n);
      if (r.phase != Request::Phase::running || r.prefilling()) continue;
      const std::size_t made = r.outputs.size();
      if (made == r.stamped) continue;  // nothing new this step
      r.stamped = made;
      if (r.last_token == 0) r.rec.first_token = clock;  // a preempted request keeps its first
      else r.rec.itl.push_back(clock - r.last_token);
      r.last_token = clock;
      if (made >= work.output_tokens) finish(r);
    }
  }

  void finish(Request& r) {
    if (cfg.verify && r.rec.resumed) {
      const auto& ref = reference(r.prompt_index);
      if (r.outputs != ref.outputs) mismatch(r, "output tokens");
    }
    if (r.rec.resumed) ++stats.resumed;
    // The tail: the full chunks not saved yet go now, or, behind the save in
    // flight, as soon as it settles. Either way their blocks stay leased by
    // the save when the request lets go of them.
    if (const auto in_flight = r.tracker.save_in_flight()) {
      const kv::TokenRange rest{in_flight->end, kv::floor_to(r.prompt(), cfg.layout.chunk_tokens)};
      std::vector<std::int32_t> pinned;
      if (conn && !rest.empty() && kv::writes_to_tier(cfg.layout))
        if (auto specs = build(r, rest, &pinned); !specs.empty()) tails[r.n] = TailSave{std::move(specs), std::move(pinned)};
    } else {
      post_saves(r);
    }
    r.rec.finish = clock;
    release_request(r);
    release_leases(r);
    stats.done.push_back(r.rec);
    live.erase(r.n);
  }

  bool warm = false;

  asio::awaitable<void> loop(std::uint32_t warmup, double seconds, std::uint64_t max_requests,
                             std::function<void(const Progress&)> progress) {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    double next_progress = 1.0;
    warm = warmup == 0;
    for (;;) {
      drain();
      if (!warm && stats.done.size() >= warmup) {
        warm = true;
        stats.warm_at = clock;
      }
      if (warm && (clock - stats.warm_at >= seconds || (max_requests && stats.done.size() >= max_requests))) break;
      // Clients join spread evenly over one request's decode time (a load
      // generator's ramp-up: one arrival per request finished in the steady
      // state). A closed loop keeps the phase its clients start in: a
      // cohort that starts together, or whose loads land together, would
      // prefill and finish together for good, every admission a burst of
      // prefills (on the H200, TTFT 57 ms against 25 for a warm restart).
      const double ramp = cfg.cost.step_seconds(0, cfg.concurrency) * work.output_tokens / cfg.concurrency;
      const std::uint64_t clients =
          ramp > 0 ? std::min<std::uint64_t>(cfg.concurrency, 1 + static_cast<std::uint64_t>(clock / ramp))
                   : cfg.concurrency;
      while (live.size() < clients) arrive();
      for (std::size_t i = 0, n = waiting.size(); i < n && running.size() < cfg.concurrency; ++i) {
        const std::uint64_t id = waiting.front();
        waiting.pop_front();
        Request& r = *live.at(id);
        if (!admit(r)) {
          waiting.push_front(id);
          break;
        }
        if (r.phase == Request::Phase::waiting) waiting.push_back(id);  // deferred on its lookup
      }
      if (cfg.preempt_loading_every && stats.steps % cfg.preempt_loading_every == 0) {
        for (auto it = running.rbegin(); it != running.rend(); ++it)
          if (live.at(*it)->phase == Request::Phase::loading) {
            co_await preempt(*live.at(*it));
            break;
          }
      }
      const auto t0 = Clock::now();
      const StepWork w = co_await step();
      ++stats.steps;
      for (std::uint64_t n : std::vector<std::uint64_t>(running.begin(), running.end())) post_saves(*live.at(n));
      if (w.prefill_tokens == 0 && w.outputs == 0) {
        // Nothing to compute: every request waits on a lookup or a load.
        // Wait a little for real, and count it.
        timer.expires_after(std::chrono::microseconds(200));
        co_await timer.async_wait(asio::use_awaitable);
        clock += std::chrono::duration<double>(Clock::now() - t0).count() + call_seconds;
        stats.kvstrand_call_seconds += call_seconds;
        call_seconds = 0;
      } else {
        const double cost = cfg.cost.step_seconds(w.prefill_tokens, w.outputs);
        clock += cost + call_seconds;
        stats.kvstrand_call_seconds += call_seconds;
        call_seconds = 0;
        stamp_tokens(w);
        if (cfg.time_scale > 0 && warm) {
          timer.expires_at(t0 + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(cost * cfg.time_scale)));
          co_await timer.async_wait(asio::use_awaitable);
        }
      }
      if (progress && clock >= next_progress) {
        next_progress = clock + 1.0;
        progress({clock, stats.done.size(), warm ? clock - stats.warm_at : 0.0});
      }
    }
    stats.end_at = clock;
    // Everything posted has settled when run() returns; the Connector stays
    // open (its debug endpoint too) until the Engine goes.
    if (conn) {
      std::vector<std::string> in_flight;
      for (const auto& [name, save] : saves)
        if (!save.settled) in_flight.push_back(name);
      for (const auto& [name, load] : loads) in_flight.push_back(name);
      co_await fence(std::move(in_flight));
    }
  }
};

Engine::Engine(EngineConfig config, Workload workload) {
  if (auto e = validate(config, workload)) throw std::invalid_argument(e->describe());
  impl_ = std::make_unique<Impl>(std::move(config), workload);
}

Engine::~Engine() {
  if (!impl_ || !impl_->conn) return;
  impl_->conn->close();
  // A copy never seen to end (F13) may still read or write the pool: it is
  // never freed (nor destroyed) while the process runs, the rule a
  // fail-stop puts on every engine.
  if (impl_->conn->never_ended() != 0) static_cast<void>(impl_.release());
}

Connector* Engine::connector() { return impl_->conn.get(); }

const RunStats& Engine::stats() const { return impl_->stats; }

RunStats Engine::run(std::uint32_t warmup, double seconds, std::uint64_t max_requests,
                     std::function<void(const Progress&)> progress) {
  asio::io_context ctx;
  std::exception_ptr failure;
  asio::co_spawn(ctx, impl_->loop(warmup, seconds, max_requests, std::move(progress)),
                 [&](std::exception_ptr e) { failure = e; });
  ctx.run();
  if (failure) std::rethrow_exception(failure);
  return impl_->stats;
}

std::uint64_t Engine::verify_checkpoints(RunStats& stats) {
  // Every cached chunk end of every prompt seen: its image against the state
  // a full recompute has after exactly that many tokens.
  auto& im = *impl_;
  std::uint64_t bad = 0;
  for (const auto& [index, toks] : im.prompts) {
    const auto hashes = im.hasher.hashes(im.ns, toks, im.cfg.layout.block_tokens);
    ToyState s;
    for (std::uint32_t t = 0; t < toks.size(); ++t) {
      ToyModel::advance(s, toks[t]);
      if ((t + 1) % im.cfg.layout.chunk_tokens != 0) continue;
      const auto slot = im.pool.checkpoint(hashes[(t + 1) / im.cfg.layout.block_tokens - 1]);
      if (!slot) continue;
      ++stats.checkpoints_checked;
      if (!(im.read_image(*slot) == s)) ++bad;
    }
  }
  return bad;
}

}  // namespace kvstrand::engine
