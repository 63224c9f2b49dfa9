// The example engine's requests: arrival, admission (the planner, the
// tier's lookups, loads), preemption, and the Connector's answers.
#include "engine_impl.hpp"

namespace kvstrand::engine {

void Engine::Impl::arrive() {
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

kv::HitSource Engine::Impl::hbm_hit(const Request& r) const {
  kv::HitSource h;
  if (!cfg.hbm_cache) return h;
  std::uint32_t blocks = 0;
  while (blocks < r.block_hashes.size() && pool.cached(r.block_hashes[blocks])) ++blocks;
  h.tokens = blocks * cfg.layout.block_tokens;
  for (std::uint32_t c = cfg.layout.chunk_tokens; c <= h.tokens; c += cfg.layout.chunk_tokens)
    if (pool.checkpoint(r.block_hashes[c / cfg.layout.block_tokens - 1])) h.checkpoints.push_back(c);
  return h;
}

std::uint32_t Engine::Impl::grid_ceiling(const Request& r) const {
  const std::uint32_t limit = r.prompt() - cfg.layout.prefill_tail();
  return kv::floor_to(limit, cfg.layout.chunk_tokens);
}

kv::HitPlan Engine::Impl::plan_request(const Request& r, kv::HitInputs in) const {
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

void Engine::Impl::release_leases(Request& r) {
  if (r.tier_lease != 0) timed([&] { conn->release_lookup(std::exchange(r.tier_lease, 0)); });
  if (r.draft_lease != 0) timed([&] { conn->release_lookup(std::exchange(r.draft_lease, 0)); });
}

kv::TransferSpec Engine::Impl::draft_spec(const Request& r, const kv::TransferSpec& target) const {
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

bool Engine::Impl::admit(Request& r) {
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

asio::awaitable<void> Engine::Impl::fence(std::vector<std::string> requests) {
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

asio::awaitable<void> Engine::Impl::preempt(Request& r) {
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

void Engine::Impl::keep_checkpoint(const Request& r, std::uint32_t end) {
  const auto& l = cfg.layout;
  if (end == 0 || end % l.chunk_tokens != 0 || end > r.prompt()) return;
  const kv::Digest& hash = r.block_hashes[end / l.block_tokens - 1];
  if (!pool.cached(hash) || pool.checkpoint(hash)) return;
  if (auto s = pool.checkpoint_slot_for(hash))
    pool.state().copy_async(pool.slot_offset(*s), pool.state(), pool.slot_offset(r.slot), l.checkpoint.image_bytes,
                            stream);
}

void Engine::Impl::settle_record(LoadInFlight& l, bool landed) {
  if (l.settled) return;
  pool.committed().load_settled(l.record, landed);
  l.settled = true;
}

void Engine::Impl::release_request(Request& r) {
  for (kv::BlockId b : r.table) pool.release(b);
  r.table.clear();
  slot_owner.erase(r.slot);
  pool.free_running_slot(r.slot);
  r.slot = -1;
  running.remove(r.n);
}

std::vector<LookupOutcome> Engine::Impl::answers_due(std::vector<LookupOutcome> arrived) {
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

void Engine::Impl::drain() {
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

void Engine::Impl::on_load(const TransferOutcome& outcome) {
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

}  // namespace kvstrand::engine
