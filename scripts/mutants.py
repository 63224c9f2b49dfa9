#!/usr/bin/python3
"""make mutants: break the code on purpose, one named mutant at a time, and
check that the tests which claim to guard each one fail.

For every mutant: a scratch copy of the committed tree (git worktree, with
its own sim build) gets that one edit, only the test binaries concerned are
built, their named cases run (each under a time limit), and the edit is
reverted. A mutant is caught when a case fails by an assertion (or a crash);
a case that hangs past its limit counts as NOT caught, because a test must
end whatever the code under it does wrong. Exits 1 if any mutant was not
caught, or could not be applied (the code it names moved: update the table).

    make mutants                       all of them
    scripts/mutants.py F14-timer F4    the named ones
    scripts/mutants.py --list
    scripts/mutants.py --check         every mutant's code is found once (no build; a CTest entry)

Not in CI: each mutant rebuilds part of the tree (about a minute here).
"""
import os
import subprocess
import sys
import time

# name, file, code as it is, code as the mutant has it, [(test binary, Catch filter)], what it breaks
MUTANTS = [
    # Several registrations, native streams, lease handoff (issue 15).
    ("order-no-wait", "src/reactor/connector.cpp",
     "  if (hip::Status s = stream.wait(*ev); !s.ok())",
     "  if (hip::Status s = hip::Status{}; !s.ok())",
     [("test_connector", "connector: order_after_load*")], "order_after_load does not make the engine's stream wait"),
    ("groups-no-cap", "src/kv/hit_plan.cpp",
     "    cap = least;  // below the previous cap: some group was above it",
     "    out.frontier = least;\n    return out;",
     [("test_hit_plan", "hit plan: several groups*")], "groups resume at different frontiers"),
    ("adopt-keeps-owner", "src/server/request_service.cpp",
     "  idx->adopt(m.lease, c.owner);",
     "  (void)c.owner;",
     [("test_request_service", "*adopted once*"), ("test_server", "server: a handed-off lease*")],
     "an adopted lease still dies with its exporter"),
    ("adopt-twice", "src/tier/index.cpp",
     "  return it != holds_.end() && it->second.lease && !it->second.adopted;",
     "  return it != holds_.end() && it->second.lease;",
     [("test_server", "server: a handed-off lease*")], "a second adopter takes another process's lease"),
    ("classes-share-slab", "src/tier/size_classes.cpp",
     "    const std::uint32_t slab = free_slabs_.front();\n    free_slabs_.pop_front();",
     "    const std::uint32_t slab = free_slabs_.front();",
     [("test_size_classes", "*")], "two object sizes are given the same slab"),
    # A registration without memory (a scheduler's, issue 16).
    ("lookup-only-copies", "src/reactor/registration.cpp",
     "  if (r.lookup_only()) return \"its registration has no device memory: it serves lookups only\";\n",
     "",
     [("test_registration", "registration: one with no memory*"),
      ("test_node_tier", "node tier: a registration with no memory*")],
     "a save through a registration without memory is posted"),
    ("draft-save-skipped", "examples/engine/engine.cpp",
     "    if (draft_layout) specs.push_back(draft_spec(r, *spec));",
     "    if (false) specs.push_back(draft_spec(r, *spec));",
     [("test_engine", "engine: the draft model*")], "the engine's second registration is never saved"),

    ("F14-timer", "src/reactor/connector.cpp",
     "    live.deadline->async_wait([self = shared_from_this(), id = t->id]",
     "    if (transfers.size() == 1) live.deadline->async_wait([self = shared_from_this(), id = t->id]",
     [("test_connector", "F14*")], "a transfer posted while another is live gets no deadline timer"),
    ("F14-after-failstop", "src/reactor/connector.cpp",
     "  void deadline_passed(std::uint64_t id) {\n",
     "  void deadline_passed(std::uint64_t id) {\n    if (fail_code) return;\n",
     [("test_connector", "F14*")], "no deadline fires after the first fail-stop"),
    ("F13-once", "src/reactor/connector.cpp",
     "  if (auto f = mailbox_->fail_stop()) throw FailStop(f->code, f->what);",
     "  static bool raised = false;\n  if (auto f = mailbox_->fail_stop(); f && !raised) { raised = true; throw FailStop(f->code, f->what); }",
     [("test_connector", "F23 and F13*")], "the fail-stop is raised once, then silence"),
    ("F1-fence-blind", "src/reactor/connector.cpp",
     "      if (live_per_request.contains(r)) return false;",
     "      if (live_per_request.contains(r) && false) return false;",
     [("test_connector", "F1: a fence covers*")], "a fence returns with its transfers still live"),
    # The engine thread's submission ring (issue 31).
    ("ring-fence-first", "src/reactor/connector.cpp",
     "    core->submissions->poll();\n    f();",
     "    f();",
     [("test_connector", "F1: a fence sees a transfer posted just before it*")],
     "a fence posted after a submit runs before the strand took the submit from the ring"),
    ("ring-no-wake", "src/reactor/handoff_queue.hpp",
     "      poller_.wake();",
     "      (void)0;",
     [("test_handoff_queue", "*wakes the poller*"), ("test_connector", "F1: a fence sees a transfer posted just before it*")],
     "a submit to a sleeping reactor is never taken"),
    ("ring-batch-unnotified", "src/reactor/connector.cpp",
     "    ~Notify() { ring.notify(); }",
     "    ~Notify() {}",
     [("test_connector", "connector: a batch submitted to a sleeping reactor*")],
     "a batch submitted to a sleeping reactor waits for some later call to wake it"),
    ("ring-sleep-unchecked", "src/reactor/handoff_queue.hpp",
     "    if (ring_.empty(std::memory_order_seq_cst)) return true;",
     "    return true;",
     [("test_handoff_queue", "*sleep() refuses*")],
     "the poller sleeps with an item in the ring (lost until the next push)"),
    ("teardown-waits", "src/hip/event_pool.cpp",
     "    if (slot->event.query().code() == Errc::not_ready) {",
     "    (void)slot->event.synchronize();\n    if (false) {",
     [("test_event_pool", "pool: destruction never waits*"), ("test_connector", "F23: a fail-stopped*")],
     "teardown waits on a wedged stream"),
    ("escape-detached", "src/reactor/connector.cpp",
     "    if (!gate.spawn(run(shared_from_this(), t), std::move(escaped))) {",
     "    (void)escaped;\n    if (!gate.spawn(run(shared_from_this(), t), [](std::exception_ptr) {})) {",
     [("test_connector", "connector: an exception escaping*")], "an exception escaping a transfer is swallowed"),
    ("fence-droppable", "examples/engine/engine.cpp",
     "      co_await fence(std::move(names));",
     "      try { co_await fence(std::move(names)); } catch (...) {}",
     [("test_engine", "engine: a preemption whose fence times out*")], "the engine frees blocks after a fence timeout"),
    ("F4-no-fence", "examples/engine/engine.cpp",
     "      co_await fence(std::move(names));",
     "      (void)names;",
     [("test_engine", "engine: a load outcome of an older generation*")],
     "a preemption frees a loading request's blocks without fencing its load"),
    ("warm-restart", "examples/engine/engine.cpp",
     "      keep_checkpoint(r, o.tokens.end);",
     "      (void)0;",
     [("test_engine", "engine: restarted against a warm node tier*")], "a landed load's image does not join HBM's cache"),
    ("bounds-block", "src/reactor/registration.cpp",
     "    if (b >= limit)",
     "    if (b > limit)",
     [("test_registration", "*")], "a block id one past the pool passes"),
    ("bounds-slot", "src/reactor/registration.cpp",
     "    if (slot >= 0 && static_cast<std::uint32_t>(slot) >= reactor::state_part(r, i % parts).slots)",
     "    if (slot >= 0 && static_cast<std::uint32_t>(slot) > reactor::state_part(r, i % parts).slots)",
     [("test_registration", "*")], "an image slot one past the state memory passes"),
    ("bounds-wrap", "src/reactor/registration.cpp",
     "  const std::uint64_t last = (std::uint64_t{s.tokens.end} + l.chunk_tokens - 1) / l.chunk_tokens;",
     "  const std::uint64_t last = static_cast<std::uint32_t>(s.tokens.end + l.chunk_tokens - 1) / l.chunk_tokens;",
     [("test_registration", "*")], "a range ending near 2^32 wraps to no key"),
    ("bounds-image-flags", "src/server/request_service.cpp",
     "  if (m.images.size() != m.keys.size())",
     "  if (m.images.size() > m.keys.size())",
     [("test_request_service", "*"), ("test_server", "*")], "a reserve with fewer image flags than keys passes"),
    ("service-hello-first", "src/server/request_service.cpp",
     "  if (!c.hello) return fail(Status::bad_request, \"send hello first\");",
     "  (void)0;",
     [("test_request_service", "*")], "a client that never said hello registers and reserves"),
    ("service-quota-reserved", "src/server/request_service.cpp",
     "  if (held.reserved_bytes + index.absent(m.keys) * index.object_bytes() > rules_.max_client_reserved)",
     "  if (false)",
     [("test_request_service", "*"), ("test_server", "server: per-process bounds*")],
     "a process reserves past --max-client-reserved"),
    ("bounds-offset-reserve", "src/reactor/remote_index.cpp",
     "        if (!arena->contains(rr.offsets[i], object_bytes)) {",
     "        if (false) {",
     [("test_node_tier", "node tier: an arena offset the server grants past the arena*")],
     "a reserved offset past the arena is written"),
    ("bounds-offset-lease", "src/reactor/remote_index.cpp",
     "    if (!lease.arena || !lease.arena->contains(off, object_bytes)) {",
     "    if (!lease.arena) {",
     [("test_node_tier", "node tier: an arena offset the server grants past the arena*")],
     "a leased offset past the arena is read"),
    ("protocol-type", "src/reactor/remote_index.cpp",
     "    if (static_cast<Type>(h.type & ~kReplyBit) != it->second->type) {",
     "    if (false) {",
     [("test_node_tier", "node tier: a reply of another type*")], "a reply of the wrong type throws in a coroutine"),
    ("planner-spec-tail", "include/kvstrand/layout.hpp",
     "std::uint32_t prefill_tail() const noexcept { return speculative.enabled() ? 2 : 1; }",
     "std::uint32_t prefill_tail() const noexcept { return 1; }",
     [("test_planner_properties", "*")], "the prefill tail is 1 under speculative decoding (F8)"),
    ("planner-no-tail", "src/kv/hit_plan.cpp",
     "  const std::uint32_t limit = std::min(in.prompt_tokens > tail ? in.prompt_tokens - tail : 0, in.max_frontier);",
     "  const std::uint32_t limit = std::min(in.prompt_tokens, in.max_frontier); (void)tail;",
     [("test_planner_properties", "*")], "a hit may cover the whole prompt (F8)"),
    ("pins-count", "src/tier/index.cpp",
     "  if (o.readers++ == 0 && o.committed) --evictable_;",
     "  const bool first = o.readers == 0;\n  o.readers = 1;\n  if (first && o.committed) --evictable_;",
     [("test_index", "*")], "a second pin does not count: one unpin makes the object evictable"),
    ("same-blocks", "src/reactor/connector.cpp",
     "    if (written || (load && u.reading[b] > 0)) return why(\"block \" + std::to_string(b), written);",
     "    if (false) return why(\"block \" + std::to_string(b), written);",
     [("test_connector", "connector: a save and a load of the same blocks*")],
     "a save and a load of the same blocks run at once"),
    ("max-live", "src/reactor/connector.cpp",
     "  if (live_.size() + batch_.size() > options_.max_live_transfers)",
     "  if (false)",
     [("test_connector", "connector: max_live_transfers*")], "the live-transfer bound is not enforced"),
    # One for every other catalogue entry whose test the project relies on.
    ("F2-tail-lease", "src/kv/tail_saves.cpp",
     "  return leases.release(s->lease);",
     "  (void)leases;\n  return {};",
     [("test_block_leases", "tail saves*")], "a retired tail save keeps its lease forever"),
    ("F3-failed-dest", "src/kv/committed_blocks.cpp",
     "  if (landed)\n",
     "  if (true)\n",
     [("test_committed_blocks", "*")], "a failed load's destinations become save sources"),
    ("F5-no-timer", "src/reactor/poller.cpp",
     "    ++stats.timer_ticks;\n",
     "    ++stats.timer_ticks;\n    running = false;\n    return;\n",
     [("test_poller", "*F5*"), ("test_connector", "F5*")], "past the spin window only a new wait wakes the poller"),
    ("F6-late-image", "examples/engine/engine.cpp",
     "        if ((u + 1) % l.chunk_tokens == 0 && u + 1 <= r.prompt()) {\n"
     "          const kv::Digest& hash = r.block_hashes[(u + 1) / l.block_tokens - 1];",
     "        if (u % l.chunk_tokens == 0 && u > 0 && u <= r.prompt()) {\n"
     "          const kv::Digest& hash = r.block_hashes[u / l.block_tokens - 1];",
     [("test_engine", "engine: every checkpoint holds*")], "a chunk end's image is the state one token later (F6, F7)"),
    ("F9-empty-load", "src/kv/hit_plan.cpp",
     "  const std::uint32_t begin = std::min(hbm_kv, tier_end - l.block_tokens);",
     "  const std::uint32_t begin = hbm_kv;",
     [("test_hit_plan", "*")], "a full hit whose KV HBM holds loads nothing, so no state arrives"),
    ("F10-no-reuse", "src/hip/event_pool.cpp",
     "  if (idle_.empty()) reclaim();",
     "  (void)0;",
     [("test_connector", "F10*")], "events are created on the hot path, never reused"),
    ("F10-any-thread", "src/hip/event_pool.cpp",
     "  if (!on_owner_thread()) return Status{Errc::wrong_executor, \"EventPool::acquire\", \"not the pool's owning thread\"};",
     "  (void)0;",
     [("test_connector", "F10*"), ("test_event_pool", "*")], "any thread may take events from the reactor's pool"),
    ("F11-close-drops", "src/reactor/connector.cpp",
     "    reactor_->call([core = core_] { return settle_all<Core, Handler>(core); });",
     "    (void)0;",
     [("test_connector", "F11*")], "close stops the reactor with transfers in flight"),
    ("F16-window", "src/kv/namespace_id.cpp",
     "  c.u64(\"sliding_window\", l.sliding_window);",
     "  (void)0;",
     [("test_chunk_keys", "namespace*")], "the sliding window does not move the namespace"),
    ("F16-unstable", "src/kv/namespace_id.cpp",
     "  std::sort(params.begin(), params.end());",
     "  (void)0;",
     [("test_chunk_keys", "namespace*")], "speculative params in another order give another namespace"),
    ("F17-one-stream", "src/reactor/host_tier.cpp",
     "co_await copy_and_wait(reactor_, *load_stream_, hip::CopyKind::host_to_device,",
     "co_await copy_and_wait(reactor_, *save_stream_, hip::CopyKind::host_to_device,",
     [("test_connector", "F17*")], "loads queue behind saves on one stream"),
    ("F18-step-waits", "src/reactor/connector.cpp",
     "  mailbox_->drain_locked(drained_);",
     "  (void)transfers();\n  mailbox_->drain_locked(drained_);",
     [("test_connector", "F18*")], "finished() waits for the strand"),
    ("save-outcome-no-blocks", "src/reactor/connector.cpp",
     "    if (e.kind == TransferKind::save || !e.ok) o.blocks = std::move(u.spec.blocks);",
     "    if (!e.ok) o.blocks = std::move(u.spec.blocks);",
     [("test_connector", "connector: a stored key*")], "a save's outcome does not name its blocks"),
    ("producer-kept-by-ring", "src/reactor/connector.cpp",
     "    t->producer = std::move(p.producer);",
     "    t->producer = p.producer;",
     [("test_connector", "connector: the producer event is let go*")], "the submission ring keeps a reference to the engine's producer event"),
    ("ring-throw-wedges", "src/reactor/handoff_queue.hpp",
     "      ~Polling() { flag = false; }",
     "      ~Polling() {}",
     [("test_handoff_queue", "handoff queue: a consumer that throws*")], "a consumer's exception leaves the ring refusing every later poll"),
    ("ring-freed-on-strand", "src/reactor/handoff_queue.hpp",
     "    ring_.consume([this](T& item) { consume_(item); });",
     "    ring_.consume([this](T& slot) {\n      T item = std::move(slot);\n      consume_(item);\n    });",
     [("test_handoff_queue", "handoff queue: a consumed item goes back*")], "what the strand leaves of a submission is freed on the strand"),
    ("ends-ring-unbounded", "src/reactor/spsc_ring.hpp",
     "    if (t - head_seen_ > mask_ && t - (head_seen_ = head_.load(std::memory_order_acquire)) > mask_) return false;",
     "    (void)head_seen_;",
     [("test_spsc_ring", "spsc ring: holds its capacity*")], "the ends' ring writes over ends the engine has not read"),
    ("ring-slot-cleared", "src/reactor/spsc_ring.hpp",
     "    fill(slots_[t & mask_]);",
     "    slots_[t & mask_] = T{};\n    fill(slots_[t & mask_]);",
     [("test_spsc_ring", "spsc ring: a consumed item stays*"), ("test_handoff_queue", "handoff queue: emplace writes*")],
     "a ring slot's consumed item (a submission's, an end's buffers) is dropped instead of written over by the producer"),
    ("ends-overflow-dropped", "src/reactor/mailbox.hpp",
     "    fill(overflow_.emplace_back());",
     "    (void)fill;",
     [("test_connector", "connector: more ends than the ring holds*")], "ends that find the mailbox's ring full are lost"),
    ("queued-notice-unset", "src/reactor/connector.cpp",
     "        t->queued_notice->store(t->queued_event, std::memory_order_release);",
     "        (void)0;",
     [("test_connector", "connector: order_after_load makes*")], "order_after_load never learns that a load's copies are queued"),
    ("ring-head-never-reread", "src/reactor/spsc_ring.hpp",
     "    if (t - head_seen_ > mask_ && t - (head_seen_ = head_.load(std::memory_order_acquire)) > mask_) return false;",
     "    if (t - head_seen_ > mask_) return false;",
     [("test_spsc_ring", "spsc ring: holds its capacity*")], "a ring once full stays full: the producer never reads the consumer's head again"),
    ("queued-event-lent-early", "src/reactor/mailbox.hpp",
     "    return r.in_ring ? ends_.consumed() > r.at : overflow_drains_.load(std::memory_order_acquire) > r.at;",
     "    return true;",
     [("test_queued_events", "queued events: one given back with an end in the ring*"),
      ("test_connector", "connector: a load's copies-queued event*")],
     "a load's copies-queued event is lent to another load while the engine may still wait on it"),
    ("queued-event-overflow-early", "src/reactor/mailbox.hpp",
     "    return r.in_ring ? ends_.consumed() > r.at : overflow_drains_.load(std::memory_order_acquire) > r.at;",
     "    return r.in_ring ? ends_.consumed() > r.at : true;",
     [("test_queued_events", "queued events: one given back with an end behind the lock*")],
     "an event given back with an end that waits behind the lock is lent again before the engine took the end"),
    ("packed-lease-cut", "src/reactor/packed_spec.cpp",
     "  s.tier_lease = std::uint64_t{w[tier_lease_low]} | std::uint64_t{w[tier_lease_high]} << 32;",
     "  s.tier_lease = std::uint64_t{w[tier_lease_low]};",
     [("test_packed_spec", "*")], "a packed spec's tier lease loses its high half"),
    ("F19-floor", "src/kv/save_tracker.cpp",
     "  if (reopens_saves(outcome) && floor_) frontier_",
     "  if (false && floor_) frontier_",
     [("test_save_tracker", "*"), ("test_planner_properties", "*")], "a load that did not land keeps the save floor up"),
    ("F20-counted", "include/kvstrand/load_outcome.hpp",
     "constexpr bool counts_as_transfer_failure(LoadOutcome o) noexcept { return o == LoadOutcome::failed; }",
     "constexpr bool counts_as_transfer_failure(LoadOutcome o) noexcept { return o != LoadOutcome::landed; }",
     [("test_save_tracker", "*")], "a withdrawn promise counts as a transfer failure"),
    ("F20-lease-kept", "src/reactor/remote_index.cpp",
     "    release_hold(lease, it->second.arena);\n    leases_.erase(it);",
     "    leases_.erase(it);",
     [("test_node_tier", "node tier: a lookup whose hit is not loaded*")], "an unloaded hit's lease is never given back"),
    ("F22-partial-release", "src/tier/index.cpp",
     "  for (std::uint32_t slot : it->second.slots) it->second.lease ? drop_reader(objects_[slot]) : abort_slot(slot);",
     "  for (std::uint32_t slot : it->second.slots) {\n"
     "    it->second.lease ? drop_reader(objects_[slot]) : abort_slot(slot);\n    break;\n  }",
     [("test_server", "server: reserve\\, commit*")], "a release unpins only part of what its lease pinned"),
    ("F23-no-deadline", "src/reactor/connector.cpp",
     "      if (!ec) self->deadline_passed(id);",
     "      if (!ec && false) self->deadline_passed(id);",
     [("test_connector", "F23 and F13*"), ("test_node_tier", "node tier: a load whose lookup*")],
     "a transfer's deadline never fires"),
    ("F23-copy-after-deadline", "src/reactor/host_tier.cpp",
     "bool still_wanted(const TierJob& job) { return !job.wanted || job.wanted(); }",
     "bool still_wanted(const TierJob&) { return true; }",
     [("test_host_tier", "*")], "a transfer failed by its deadline still copies once its index answers"),
    ("F24-no-reap", "src/server/tier_server.cpp",
     "    const std::size_t freed = classes->release_owner(p->owner);",
     "    const std::size_t freed = 0;",
     [("test_server", "server: a client SIGKILLed holding a lease*")], "a dead client's leases stay"),
    ("F25-no-second-chance", "src/tier/index.cpp",
     "    if (o.referenced) {\n      o.referenced = false;",
     "    if (false) {\n      o.referenced = false;",
     [("test_index", "*")], "eviction ignores recent use"),
    ("F25-rewrite", "src/tier/index.cpp",
     "  if (find(key, h) != kNone) return Reserve::exists;",
     "  (void)0;",
     [("test_index", "*"), ("test_server", "server: reserve\\, commit*")], "a stored key is reserved and written again"),
    ("F27-evict-read", "src/tier/index.cpp",
     "    if (!o.used || !o.committed || o.readers != 0) continue;  // free, being written, or held",
     "    if (!o.used || !o.committed) continue;",
     [("test_index", "*"), ("test_connector", "F27*")], "an object being read may be evicted"),
    ("F29-never-freed", "src/kv/block_leases.cpp",
     "    if (freed_but_pinned_.erase(b) != 0) returned.push_back(b);",
     "    freed_but_pinned_.erase(b);\n    returned.push_back(b);",
     [("test_block_leases", "*")], "a release returns blocks the engine never freed"),
    ("F30-cause-lost", "src/reactor/copy_and_wait.cpp",
     "Failure{TransferErrc::device_error, \"device: \" + ec.message()}",
     "Failure{TransferErrc::device_error, \"device error\"}",
     [("test_engine", "engine: a failed load reports*")], "a failed copy's own cause is dropped"),
    ("F31-always-look", "examples/engine/engine.cpp",
     "      if (local.frontier < grid_ceiling(r)) {",
     "      if (true) {",
     [("test_engine", "engine: a working set that fits HBM*")], "a working set that fits HBM still asks the tier"),
    ("F34-rank-keys", "src/kv/chunk_keys.cpp",
     "std::uint32_t kv_rank_of(const Layout& l) noexcept { return l.replicated_across_tp ? 0 : l.tp_rank; }",
     "std::uint32_t kv_rank_of(const Layout& l) noexcept { return l.tp_rank; }",
     [("test_chunk_keys", "*F34*")], "replicated state is keyed per rank"),
    ("F34-every-rank-writes", "src/kv/chunk_keys.cpp",
     "bool writes_to_tier(const Layout& l) noexcept { return !l.replicated_across_tp || l.tp_rank == 0; }",
     "bool writes_to_tier(const Layout& l) noexcept { (void)l; return true; }",
     [("test_chunk_keys", "*F34*")], "every rank stores the replicated state"),
    # Protocol 2: every id and count a request carries.
    ("bounds-commit-lease", "src/tier/index.cpp",
     "  if (it == holds_.end() || it->second.lease) return false;",
     "  if (it == holds_.end()) return false;",
     [("test_server", "server: every request's bounds*")], "a commit ends a lease"),
    ("bounds-slab", "src/server/request_service.cpp",
     "  if (object > facts_.slab_bytes)",
     "  if (object > facts_.slab_bytes + 1)",
     [("test_server", "server: an object one byte past a slab*")], "an object one byte past a slab is registered"),
    # kvstrand.vllm under vLLM's bookkeeping (issue 27): ("pytest:FILE", "-k" expression).
    ("vllm-abort-double-free", "python/kvstrand/vllm/scheduler.py",
     "        if r.load_blocks is not None:\n",
     "        if False:\n",
     [("pytest:test_vllm.py", "reloads_its_own")], "a request aborted while it loads is reported sent after vLLM freed it"),
    ("vllm-keys-tokens-only", "python/kvstrand/vllm/keys.py",
     "    if seed is None and not items:\n        return base",
     "    if True:\n        return base",
     [("pytest:test_vllm.py", "images_adapters")], "two images, adapters or salts share a chunk key"),
    ("vllm-model-dtype", "python/kvstrand/vllm/config.py",
     "dtype=str(model.dtype) if cache_dtype == \"auto\" else cache_dtype",
     "dtype=str(model.dtype)",
     [("pytest:test_vllm.py", "cache_dtype")], "fp8 caches of one model share a namespace"),
    ("vllm-unbounded-reloads", "python/kvstrand/vllm/scheduler.py",
     "        if r.load_failures >= self.cfg.max_load_failures:",
     "        if False:",
     [("pytest:test_vllm.py", "keep_failing")], "a request whose loads fail is offered hits without end"),
    ("vllm-window-blocks-saved", "python/kvstrand/vllm/scheduler.py",
     "            if len(ids) != (end - begin) // bs or NULL_BLOCK in ids:\n                continue\n"
     "            if group.sliding_window",
     "            if len(ids) != (end - begin) // bs:\n                continue\n            if False and group.sliding_window",
     [("pytest:test_vllm.py", "null_block")], "a sliding window's null or freed blocks are saved"),
    ("vllm-no-realloc-fence", "python/kvstrand/vllm/worker.py",
     "        if allocated:\n            hit |=",
     "        if False:\n            hit |=",
     [("pytest:test_vllm.py", "does_not_announce")], "a save still reads blocks vLLM gave to another request"),
    ("vllm-window-loads-null", "python/kvstrand/vllm/scheduler.py",
     "            first = next((i for i, b in enumerate(ids) if b != NULL_BLOCK), len(ids))",
     "            first = 0",
     [("pytest:test_vllm.py", "hybrid_model_resumes")], "a sliding window's load writes the null block"),
    # The Python binding's finished() (a plain CPython method; issue 31).
    ("py-finished-never-drains", "src/python/connector.cpp",
     "  if (!py::detail::cast_op<PyConnector&>(conn).finished_pending()) {",
     "  if (true) {",
     [("pytest:test_connector.py", "fail_stop_raised_by_every_later_call")],
     "Python's finished() answers nothing to drain when an end or a fail-stop waits"),
    ("vllm-stream-0-ignored", "python/kvstrand/vllm/worker.py",
     "if stream is not None else kvstrand.Producer()",
     "if stream else kvstrand.Producer()",
     [("pytest:test_vllm.py", "default_stream")], "saves do not wait for torch's default stream"),
    ("vllm-free-while-saving", "python/kvstrand/vllm/worker.py",
     "                   if r not in self.saving and r not in self.saves_queued and r not in self.loading}",
     "                   if r not in self.loading}",
     [("pytest:test_vllm.py", "freed_only_after_its_saves")], "vLLM frees blocks a posted save still reads"),
    ("vllm-late-answer-keeps-lease", "python/kvstrand/vllm/scheduler.py",
     "                if answer.lease:\n                    self.conn.release_lookup(answer.lease)\n                continue\n"
     "            del r.lookups",
     "                continue\n            del r.lookups",
     [("pytest:test_vllm.py", "gives_its_lease")], "a lookup answered after its request ended keeps its lease"),
    ("vllm-queued-save-posted", "python/kvstrand/vllm/worker.py",
     "            for job in self.saves_queued.pop(req_id, ()):\n                self._save_ended(job, None, False)",
     "            pass",
     [("pytest:test_vllm.py", "fences_the_requests_transfers")], "a preempted request's queued save is posted after the fence"),
    ("vllm-events-one-rank", "python/kvstrand/vllm/events.py",
     "        p.waiting.discard(record.rank)\n        if p.waiting:\n            return\n",
     "        p.waiting.discard(record.rank)\n",
     [("pytest:test_vllm.py", "every_writing_rank_committed")], "a save is announced before every rank committed it"),
    ("vllm-events-failed-announced", "python/kvstrand/vllm/worker.py",
     "self._save_ended(live.job, group, out.ok)", "self._save_ended(live.job, group, True)",
     [("pytest:test_vllm.py", "one_rank_failed")], "a failed save is announced stored"),
    ("vllm-events-no-removal", "python/kvstrand/vllm/scheduler.py",
     "                self.events.prefix_found(g, r.hashes[g], answer.hit.tokens // self.cfg.chunk_tokens)",
     "                pass",
     [("pytest:test_vllm.py", "and_their_loss")], "blocks the tier lost are never announced removed"),
    ("vllm-events-reset-silent", "python/kvstrand/vllm/scheduler.py",
     "            self.events.forget_all()", "            pass",
     [("pytest:test_vllm.py", "reset_cache_removes_all")], "reset_cache leaves the router believing the old blocks"),
    # Mamba groups as checkpoints of the attention group (issue 27).
    ("vllm-mamba-state-every-chunk", "python/kvstrand/vllm/scheduler.py",
     "                    slots = [-1] * (len(at_end) * ((end - begin) // ct - 1)) + at_end",
     "                    slots = at_end * ((end - begin) // ct)",
     [("pytest:test_vllm.py", "only_where_a_step_ended")],
     "every chunk of a save carries the state of its last chunk's end"),
    ("vllm-mamba-state-wrong-block", "python/kvstrand/vllm/scheduler.py",
     "        i = at // self.cfg.block_size - 1\n",
     "        i = at // self.cfg.block_size\n",
     [("pytest:test_vllm.py", "seeds_shape")], "a load writes the state one block past where vLLM reads it"),
    # A node tier that survives its server (issue 32).
    ("arena-reserve-says-committed", "src/tier/object_table.cpp",
     "  store_state(e, kReserved);  // first: the slot is no longer what it held",
     "  store_state(e, kCommitted);",
     [("test_object_table", "*never a reservation*"), ("test_arena_recovery", "*SIGKILLed mid-store*")],
     "a reservation the killed server never committed is served after the restart"),
    ("arena-entry-unchecked", "src/tier/object_table.cpp",
     "      if (state == kCommitted && get_field<std::uint64_t>(e + kCheckAt) == entry_check(e) &&",
     "      if (state == kCommitted &&",
     [("test_object_table", "*corrupted entry*"), ("test_arena_recovery", "*corrupted table entry*")],
     "a corrupted entry is read as an object"),
    ("arena-stale-entries", "src/tier/object_table.cpp",
     "  std::memset(h, 0, g.first_object);  // no entry of an earlier life survives the new header",
     "  std::memset(h, 0, kSlabHeaderBytes);",
     [("test_object_table", "*another class holds no entry*")], "a reassigned slab keeps entries of its earlier life"),
    ("arena-not-recovered", "src/server/tier_server.cpp",
     "  recovery = recover(*table, *classes);",
     "  recovery.reopened = true;",
     [("test_arena_recovery", "*SIGKILLed mid-store*")], "a restarted server forgets its named arena's objects"),
    ("arena-any-version", "src/tier/object_table.cpp",
     "    if (version != kObjectTableVersion) {",
     "    if (false) {",
     [("test_object_table", "*another format version*"), ("test_arena_recovery", "*another format version*")],
     "an arena of another format version is read as this one"),
    ("named-arena-remapped", "src/reactor/remote_index.cpp",
     "  if (mapping_ && mapping_->is_file(arena_fd)) {",
     "  if (false) {",
     [("test_arena_recovery", "*SIGKILLed mid-store*")], "a client maps and pins the named arena again at every restart"),
    ("server-life-by-file", "src/reactor/remote_index.cpp",
     "  return arena && arena_ && !arena.owner_before(arena_) && !arena_.owner_before(arena);",
     "  return arena && arena_ && arena.get() == arena_.get();",
     [("test_node_tier", "*the server restarted on its named arena*")],
     "holds of a server that restarted on the same named arena are taken for the new server's"),
    ("arena-memory-counted-twice", "src/server/server_options.cpp",
     "      o.tier_bytes > avail + tier::held_by_named_arena(o.arena_path, o.tier_bytes))",
     "      o.tier_bytes > avail)",
     [("test_arena_recovery", "*could not hold twice*")],
     "a server restarted on a big named arena is refused: the file's own pages counted as needed again"),
    ("state-parts-one-slot", "src/tier/object_format.hpp",
     "      const std::int32_t slot = save ? s.state_slots[c * parts + p] : s.state_slots[p];",
     "      const std::int32_t slot = save ? s.state_slots[c * parts] : s.state_slots[0];",
     [("test_registration", "registration: an image kept in two state memories*"),
      ("pytest:test_vllm.py", "seeds_shape")], "every state memory's part of an image is taken from the first memory's slot"),
    ("state-parts-shared-counts", "src/reactor/registration.hpp",
     "    first += static_cast<std::int32_t>(state_part(reg, i % parts).slots);\n",
     "",
     [("test_registration", "registration: an image kept in two state memories*")],
     "the Connector counts slot 3 of one state memory as slot 3 of another"),
    # The disk tier (issue 33).
    ("disk-payload-unchecked", "src/server/disk_tier.cpp",
     "             l2::object_matches(*h, {arena_object(*j.arena_index, j.arena_slot), object_bytes});",
     "             true;",
     [("test_disk_tier", "*flipped byte*")], "a disk object whose bytes changed is loaded"),
    ("disk-other-key-loads", "src/server/disk_tier.cpp",
     "      good = h && h->key == key && h->has_image == j.image &&",
     "      good = h && h->has_image == j.image &&",
     [("test_chunk_value", "*the header alone*"), ("test_disk_tier", "*flipped byte*")],
     "a disk slot holding another chunk (its header torn after recovery) is loaded for this one"),
    ("disk-bad-object-kept", "src/server/disk_tier.cpp",
     "    if (!good) j.disk_index->erase(key);\n", "",
     [("test_disk_tier", "*flipped byte*")], "a disk object that failed its check is read again at every lookup"),
    ("disk-recovery-reads-part", "src/server/disk_ring.cpp",
     "      if (sqe == nullptr) break;\n", "      if (sqe == nullptr) { batch[next++].result = -EAGAIN; continue; }\n",
     [("test_disk_tier", "*restarted server finds*")],
     "a restarted server reads only as many slot headers as its ring holds at once and forgets the rest"),
    ("disk-arena-unaligned", "src/server/tier_server.cpp",
     "  const std::uint64_t align = opt.disk ? kDiskBlock : 1;", "  const std::uint64_t align = 1;",
     [("test_disk_tier", "*read back from the disk byte for byte*")],
     "the arena's slots are not 4 KiB-aligned with a disk: O_DIRECT cannot read or write them in place"),
    ("disk-timeout-ignored", "src/server/disk_tier.cpp",
     "      batch->timer.expires_after(opt.timeout);", "      batch->timer.expires_after(std::chrono::hours(1));",
     [("test_disk_tier", "*slow disk*")], "a lookup waits for a slow disk past --disk-timeout"),
    ("disk-failed-write-pinned", "src/server/disk_tier.cpp",
     "    j.arena_index->unpin(std::span<const kv::ChunkKey>(&key, 1));\n    queued_bytes -= j.arena_index->object_bytes();\n  }\n\n  void read_done",
     "    queued_bytes -= j.arena_index->object_bytes();\n  }\n\n  void read_done",
     [("test_disk_tier", "*writes failing*"), ("test_disk_tier", "*read back from the disk byte for byte*")],
     "an object written behind stays pinned in the arena: it fills and refuses saves"),
    ("disk-queue-pins-arena", "src/server/tier_server.cpp",
     "    impl_->opt.disk->max_queued_bytes = impl_->arena->bytes() / 8;\n", "",
     [("test_disk_tier", "*a disk slower than the saves*")],
     "a slow disk's write queue pins the whole arena: saves are refused as full"),
    ("disk-second-server", "src/server/disk_tier.cpp",
     "  if (::flock(fd, LOCK_EX | LOCK_NB) != 0)", "  if (false)",
     [("test_disk_tier", "*second server*")], "two servers write the same disk file"),
    # Values a Redis writer cannot forge (issue 29, item 12).
    ("l2-mac-not-checked", "src/l2/chunk_value.cpp",
     "    if (!tag_of(*mac, h, object, tag) || CRYPTO_memcmp(tag, h + kTagAt, kTagBytes) != 0) {",
     "    if (!tag_of(*mac, h, object, tag)) {",
     [("test_chunk_value", "chunk value: with a MAC key*"), ("test_l2_tier", "l2: with a MAC key*")],
     "a value altered by a writer without the key is loaded"),
    ("l2-mac-keyless-loads", "src/l2/chunk_value.cpp",
     "  if (mac != nullptr || has_tag) {", "  if (mac != nullptr) {",
     [("test_chunk_value", "chunk value: with a MAC key*"), ("test_l2_tier", "l2: with a MAC key*")],
     "a node without the key loads MACed values it cannot check"),
    ("server-orphan-session", "src/server/tier_server.cpp",
     "    for (auto& s : its) end_session(s, \"its process exited\");\n", "",
     [("test_server", "*forked child*")], "a connection whose process exited keeps creating holds nobody frees"),
    ("index-token-wrap", "src/tier/index.cpp",
     "    if ((static_cast<std::uint64_t>(n) + 1) * chunk_tokens > UINT32_MAX) break;\n", "",
     [("test_index", "*32-bit*")], "a hit's token count wraps (a lease past the quota as 0 tokens)"),
    ("server-socket-clobbers", "src/server/tier_server.cpp",
     "      if (!S_ISSOCK(st.st_mode))\n", "      if (false)\n",
     [("test_server", "*replaces only a stale socket*")], "--socket replaces a regular file or a directory"),
    ("server-accept-spins", "src/server/tier_server.cpp",
     "        co_await accept_backoff.failed(ec.value(), \"kvstrand-server\");\n", "",
     [("test_server", "*accept backs off*")], "accept() failing with EMFILE is retried at once (a core spins)"),
    ("quota-reserve-counts-stored", "src/server/request_service.cpp",
     "index.absent(m.keys) * index.object_bytes()", "m.keys.size() * index.object_bytes()",
     [("test_request_service", "*count what a request would hold*")], "a reserve of stored keys counts against the quota"),
    ("quota-adopt-own-twice", "src/server/request_service.cpp",
     "idx->owner_of(m.lease) == c.owner ? 0 : ", "",
     [("test_request_service", "*count what a request would hold*")], "adopting its own lease counts it twice"),
    ("release-on-new-server", "src/reactor/remote_index.cpp",
     "    if (current(of)) send_only(Release{hold});", "    send_only(Release{hold});",
     [("test_node_tier", "*restarted is never released*")], "a hold of a dead server is released on its successor (another process's)"),
    ("commit-on-new-server", "src/reactor/remote_index.cpp",
     "  if (!current(places.memory))\n", "  if (false)\n",
     [("test_node_tier", "*never committed on the new one*")], "a save reserved on a dead server commits another process's reservation"),
    ("leased-load-connects", "src/reactor/remote_index.cpp",
     "  Held h;\n  const Registration& reg", "  Held h;\n  if ((h.failure = co_await ensure_connected())) co_return h;\n  const Registration& reg",
     [("test_node_tier", "*leased load needs no server*")], "a leased load fails because the server just died"),
    ("l2-bad-value-kept", "src/server/l2_tier.cpp",
     "        forget(l2::redis_key_of(keys[i]));\n", "",
     [("test_l2_tier", "*altered in Redis*")], "a corrupt L2 value stays, fetched and refused on every lookup"),
    ("bounds-registration", "src/server/request_service.cpp",
     "  if (it == c.regs.end()) return fail(Status::unknown_registration, \"no such registration\");\n"
     "  const kv::Layout& l = it->second.layout;",
     "  if (it == c.regs.end()) it = c.regs.begin();\n"
     "  if (it == c.regs.end()) return fail(Status::unknown_registration, \"no such registration\");\n"
     "  const kv::Layout& l = it->second.layout;",
     [("test_request_service", "*its client's own*"), ("test_server", "server: every request's bounds*")],
     "an unknown registration id falls back to the session's"),
    # Issue 34, second round: behaviours no test guarded.
    ("index-pin-part-way", "src/tier/index.cpp",
     "    if (s == kNone || !objects_[s].committed) return std::nullopt;\n    slots.push_back(s);",
     "    if (s == kNone || !objects_[s].committed) return std::nullopt;\n    slots.push_back(s);\n    add_reader(objects_[s]);",
     [("test_index", "*fails part-way*")], "a pin that fails part-way leaves its first keys pinned for good"),
    ("index-evicts-writing", "src/tier/index.cpp",
     "    if (!o.used || !o.committed || o.readers != 0) continue;  // free, being written, or held",
     "    if (!o.used || o.readers != 0) continue;",
     [("test_index", "*passes over an object being written*")], "eviction takes an object whose copy is in flight"),
    ("index-erase-no-shift", "src/tier/index.cpp",
     "    if (((j - home) & mask_) >= ((j - i) & mask_)) {",
     "    if (false) {",
     [("test_index", "*keeps every other key findable*")], "a deleted key's hole hides the keys probed past it"),
    ("index-erase-shift-any", "src/tier/index.cpp",
     "    if (((j - home) & mask_) >= ((j - i) & mask_)) {",
     "    if (true) {",
     [("test_index", "*keeps every other key findable*")], "a key shifted before its own home is no longer found"),
    ("classes-one-slab", "src/tier/size_classes.cpp",
     "  while (idx.free_slots() < want && !free_slabs_.empty()) {",
     "  if (idx.free_slots() < want && !free_slabs_.empty()) {",
     [("test_size_classes", "*more than one slab*")], "a reservation larger than a slab evicts or is refused with slabs unused"),
    ("save-commits-failed-copy", "src/reactor/host_tier.cpp",
     "co_await index_->commit(s.registration, s.keys, places, copied, job.deadline);",
     "co_await index_->commit(s.registration, s.keys, places, true, job.deadline);",
     [("test_host_tier", "*device copy failed commits nothing*")], "a save whose copy failed publishes half-written objects"),
    ("load-keeps-pin-on-failure", "src/reactor/host_tier.cpp",
     "  index_->release(s, held);  // the copy is done",
     "  if (!copy.failure) index_->release(s, held);  // the copy is done",
     [("test_host_tier", "*load whose device copy failed*")], "a failed load leaves its objects pinned for good"),
    ("late-reserve-kept", "src/reactor/remote_index.cpp",
     "        if (auto* r = std::get_if<ReserveReply>(&reply->payload)) release_hold(r->reservation, arena_);\n", "",
     [("test_node_tier", "*granted after its save gave up*")], "a reservation granted after its caller gave up is held until the process exits"),
    ("unsent-release-dropped", "src/reactor/remote_index.cpp",
     "    if (current(of)) send_only(Release{hold});\n  co_return Failure{};",
     "    if (false && current(of)) send_only(Release{hold});\n  co_return Failure{};",
     [("test_node_tier", "*could not be sent while disconnected*")], "a release made while disconnected is never sent: the server keeps the lease"),
    ("claim-no-rollback", "src/reactor/connector.cpp",
     "      for (std::size_t j = 0; j < i; ++j) count(ops[j], -1);\n", "",
     [("test_connector", "*refused batch leaves no claim*")], "a refused batch leaves its first ops' blocks claimed"),
    ("handoff-all-keys", "src/reactor/connector.cpp",
     "      it->second.keys.resize(n);\n", "",
     [("test_node_tier", "*partial hit's exported lease*")], "a partial hit's hand-off names chunks the lease does not hold"),
    ("leased-load-keeps-lease", "src/reactor/connector.cpp",
     "    if (op.kind == TransferKind::load && op.spec.tier_lease != 0) leases_held_.erase(op.spec.tier_lease);\n", "",
     [("test_node_tier", "*partial hit's exported lease*")], "a lease a load used can be exported (or named) again"),
    ("quota-per-connection", "src/server/request_service.cpp",
     "  const auto held = classes_.held_by(c.owner);\n  if (held.reserved_bytes",
     "  const auto held = classes_.held_by(c.session);\n  if (held.reserved_bytes",
     [("test_request_service", "*quotas are per process*")], "a process passes its reservation quota by opening connections"),
    ("quota-adopt-free", "src/server/request_service.cpp",
     "idx->owner_of(m.lease) == c.owner ? 0 : slots.size() * idx->object_bytes()", "0",
     [("test_request_service", "*quotas are per process*")], "a process passes its lease quota by adopting leases"),
    ("quota-lease-counts-keys", "src/server/request_service.cpp",
     "    const kv::HitSource peek = index.lookup(m.keys, l.chunk_tokens);\n"
     "    if (held.leased_bytes + peek.tokens / l.chunk_tokens * index.object_bytes() > rules_.max_client_leased)\n",
     "",
     [("test_request_service", "*counts what its hit pins*")], "a lookup is refused for keys it would never pin"),
    ("l2-writer-keeps-pin", "src/server/l2_tier.cpp",
     "        q.index->unpin(std::span<const kv::ChunkKey>(&q.key, 1));  // its bytes are taken\n", "",
     [("test_l2_tier", "*write-behind unpins*")], "every object written behind stays pinned: the arena fills for good"),
    ("l2-promote-past-gap", "src/server/l2_tier.cpp",
     "      if (r.value.kind == l2::RedisValue::Kind::nil) break;",
     "      if (r.value.kind == l2::RedisValue::Kind::nil) continue;",
     [("test_l2_tier", "*write-behind unpins*")], "values after a gap are promoted under earlier keys (wrong bytes)"),
    ("redis-moved-not-mapped", "src/l2/redis_cluster.cpp",
     "        slots[slot] = target;\n", "",
     [("test_redis_cluster", "*moves its slot in the client's map at once*")], "every command of a moved slot pays a MOVED until a refresh"),
    ("redis-lost-stay-counted", "src/l2/redis_connection.cpp",
     "  --self->inflight_;\n  RedisResult r;\n  if (reply == nullptr) {\n",
     "  RedisResult r;\n  if (reply == nullptr) {\n",
     [("test_redis_cluster", "*in flight on a connection that is lost*")], "commands lost with a connection count against the node forever"),
    ("l2-any-version", "src/l2/chunk_value.cpp",
     "  if (get<std::uint32_t>(h + kVersionAt) != kChunkValueVersion) {",
     "  if (false) {",
     [("test_chunk_value", "*another format version*")], "a value of another format version is read as this one's"),
    ("l2-auth-not-sent", "src/l2/redis_connection.cpp",
     "  if (!credentials_.password.empty()) {", "  if (false) {",
     [("test_l2_tier", "*password and an ACL user*")], "--l2-user and its password are never sent: L2 never works with a Redis password"),
    ("l2-auth-refusal-silent", "src/l2/redis_cluster.cpp",
     "        refused = true;\n        continue;", "        continue;",
     [("test_l2_tier", "*password and an ACL user*")], "wrong credentials look like an unreachable Redis, with no word of the options"),
    ("l2-password-file-any-mode", "src/server/server_options.cpp",
     "  } else if ((st.st_mode & 077) != 0) {", "  } else if (false) {",
     [("test_l2_tier", "*password and an ACL user*"), ("test_l2_tier", "*bad --l2 flags*")], "a password file anyone can read is accepted"),
    ("server-full-while-growing", "src/server/tier_server.cpp",
     "      if (auto* rv = std::get_if<Reserve>(&*req); rv && growing()) co_await room_for(s, *rv);\n", "",
     [("test_server", "*arena cannot hold yet*")], "a starting server answers `full` to what its next slabs would hold"),
    ("plan-last-checkpoint", "src/kv/hit_plan.cpp",
     "    if (c <= kv && c % l.chunk_tokens == 0) best = std::max(best, c);",
     "    if (c <= kv && c % l.chunk_tokens == 0) best = c;",
     [("test_hit_plan", "*whatever the order*")], "an unordered checkpoint list resumes at its last usable entry, not the largest"),
    ("handoff-any-version", "src/proto/lease_handoff.cpp",
     "  if (const std::uint8_t v = r.u8(); v != kVersion) {",
     "  if (const std::uint8_t v = r.u8(); v != kVersion && false) {",
     [("test_lease_handoff", "*other-version*")], "a hand-off of another version is read as this one's"),
]

TIMEOUT_S = 120


def run(cmd, cwd, timeout=None):
    return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def test_command(build, scratch, binary, filt):
    """A Catch binary with a filter, or "pytest:FILE" with a -k expression
    (Debian's interpreter, the scratch build's module and server)."""
    if not binary.startswith("pytest:"):
        return [os.path.join(build, "tests", binary), filt]
    return ["env", f"PYTHONPATH={build}/python", f"KVSTRAND_SERVER={build}/kvstrand-server",
            "PYTHONDONTWRITEBYTECODE=1", "/usr/bin/python3", "-m", "pytest", "-q", "-p", "no:cacheprovider",
            os.path.join(scratch, "tests", "python", binary[len("pytest:"):]), "-k", filt]


def build_target(test):
    """What a test needs built: its binary, or the Python module (which copies the package)."""
    return "kvstrand_python" if test.startswith("pytest:") else test


def main(argv):
    if "--list" in argv:
        for name, path, _, _, tests, what in MUTANTS:
            print(f"{name:20} {path:34} {what}")
        return 0
    if "--check" in argv:
        # Cheap, no build: every mutant still names code found exactly once
        # (a refactor that moves the code leaves the mutant unapplied).
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        stale = [(name, path, open(os.path.join(repo, path)).read().count(old))
                 for name, path, old, _, _, _ in MUTANTS]
        stale = [s for s in stale if s[2] != 1]
        for name, path, n in stale:
            print(f"mutants: {name}: its code is found {n} times in {path}")
        print(f"mutants: {len(MUTANTS) - len(stale)} of {len(MUTANTS)} apply")
        return 1 if stale else 0
    chosen = [m for m in MUTANTS if not argv or m[0] in argv]
    unknown = set(argv) - {m[0] for m in MUTANTS}
    if unknown:
        print("mutants: unknown mutant(s): " + ", ".join(sorted(unknown)) + " (see --list)")
        return 2
    repo = subprocess.check_output(["git", "rev-parse", "--show-toplevel"], text=True).strip()
    scratch = os.environ.get("MUTANTS_DIR", "/tmp/kvstrand-mutants")
    head = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=repo, text=True).strip()
    if not os.path.isdir(scratch):
        run(["git", "worktree", "add", "--detach", scratch, head], repo).check_returncode()
    run(["git", "checkout", "--detach", "--force", head], scratch).check_returncode()
    build = os.path.join(scratch, "build")
    print(f"mutants: {len(chosen)} mutant(s) of {head[:10]} in {scratch}", flush=True)
    cfg = run(["cmake", "-S", ".", "-B", "build", "-G", "Ninja", "-Wno-dev", "-DKVSTRAND_GPU=sim",
               "-DKVSTRAND_BENCH=OFF"], scratch)
    if cfg.returncode != 0:
        print(cfg.stdout)
        return 2
    targets = sorted({build_target(t) for m in chosen for t, _ in m[4]} | {"kvstrand-server", "kvstrand-tier-client"})
    t0 = time.time()
    base = run(["cmake", "--build", "build", "--target", *targets], scratch)
    if base.returncode != 0:
        print(base.stdout[-4000:])
        return 2
    print(f"mutants: unmutated build of {len(targets)} targets in {time.time() - t0:.0f} s", flush=True)
    results = []
    for name, path, old, new, tests, what in chosen:
        file = os.path.join(scratch, path)
        text = open(file).read()
        if text.count(old) != 1:
            results.append((name, "NOT APPLIED", f"the code it names is found {text.count(old)} times in {path}"))
            print(f"  {name:20} NOT APPLIED", flush=True)
            continue
        open(file, "w").write(text.replace(old, new))
        try:
            t0 = time.time()
            b = run(["cmake", "--build", "build", "--target", *sorted({build_target(t) for t, _ in tests})], scratch)
            if b.returncode != 0:
                verdict, why = "NOT BUILT", b.stdout[-600:]
            else:
                verdict, why = "NOT caught", "every named case passed"
                for binary, filt in tests:
                    try:
                        r = run(test_command(build, scratch, binary, filt), scratch, timeout=TIMEOUT_S)
                    except subprocess.TimeoutExpired:
                        verdict, why = "NOT caught", f"{binary} '{filt}' hung past {TIMEOUT_S} s"
                        break
                    # A filter that names no case proves nothing (a Catch spec
                    # splits at commas): the table needs fixing, not a verdict.
                    if "No tests ran" in r.stdout or (binary.startswith("pytest:") and r.returncode == 5):
                        verdict, why = "NO CASE", f"{binary} '{filt}' matches no test case"
                        break
                    if r.returncode != 0:
                        verdict, why = "caught", f"{binary} '{filt}' failed"
                        break
        finally:
            open(file, "w").write(text)
        results.append((name, verdict, why))
        print(f"  {name:20} {verdict:11} ({time.time() - t0:.0f} s) {why.splitlines()[0] if why else ''}", flush=True)
    bad = [r for r in results if r[1] != "caught"]
    print(f"mutants: {len(results) - len(bad)} of {len(results)} caught")
    for name, verdict, why in bad:
        print(f"  {name}: {verdict}: {why}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
