#include "engine_impl.hpp"

#include <spdlog/spdlog.h>

#include <stdexcept>

namespace kvstrand::engine {

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

Engine::Impl::Impl(EngineConfig c, Workload w)
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

Engine::Impl::~Impl() {
  try {
    stream.synchronize();
  } catch (const std::exception& e) {
    spdlog::error("engine: the stream's last copies: {}", e.what());
  }
}

asio::awaitable<Engine::Impl::StepWork> Engine::Impl::step() {
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

void Engine::Impl::produce_token(Request& r) {
  const std::uint32_t tok = ToyModel::next_token(r.state);
  const std::uint32_t pos = r.prompt() + static_cast<std::uint32_t>(r.outputs.size());
  r.outputs.push_back(tok);
  compute(r, pos, pos + 1, &tok);
}

void Engine::Impl::stamp_tokens(const StepWork&) {
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

void Engine::Impl::finish(Request& r) {
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

asio::awaitable<void> Engine::Impl::loop(std::uint32_t warmup, double seconds, std::uint64_t max_requests,
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
