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

Not in CI: each mutant rebuilds part of the tree (about a minute here).
"""
import os
import subprocess
import sys
import time

# name, file, code as it is, code as the mutant has it, [(test binary, Catch filter)], what it breaks
MUTANTS = [
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
    ("teardown-waits", "src/hip/event_pool.cpp",
     "    if (slot->event.query().code() == Errc::not_ready) {",
     "    (void)slot->event.synchronize();\n    if (false) {",
     [("test_event_pool", "pool: destruction never waits*"), ("test_connector", "F23: a fail-stopped*")],
     "teardown waits on a wedged stream"),
    ("escape-detached", "src/reactor/connector.cpp",
     "asio::co_spawn(reactor.strand(), run(shared_from_this(), t), std::move(escaped));",
     "(void)escaped;\n    asio::co_spawn(reactor.strand(), run(shared_from_this(), t), [](std::exception_ptr) {});",
     [("test_connector", "connector: an exception escaping*")], "an exception escaping a transfer is swallowed"),
    ("fence-droppable", "examples/engine/engine.cpp",
     "      co_await conn->async_fence(std::move(names), cfg.fence_timeout, asio::use_awaitable);",
     "      try { co_await conn->async_fence(std::move(names), cfg.fence_timeout, asio::use_awaitable); } catch (...) {}",
     [("test_engine", "engine: a preemption whose fence times out*")], "the engine frees blocks after a fence timeout"),
    ("F4-no-fence", "examples/engine/engine.cpp",
     "      co_await conn->async_fence(std::move(names), cfg.fence_timeout, asio::use_awaitable);",
     "      (void)names;",
     [("test_engine", "engine: a load outcome of an older generation*")],
     "a preemption frees a loading request's blocks without fencing its load"),
    ("warm-restart", "examples/engine/engine.cpp",
     "      keep_checkpoint(r, o.tokens.end);",
     "      (void)0;",
     [("test_engine", "engine: restarted against a warm node tier*")], "a landed load's image does not join HBM's cache"),
    ("bounds-block", "src/reactor/registration.cpp",
     "      if (b >= r.planes[p].num_blocks)",
     "      if (b > r.planes[p].num_blocks)",
     [("test_registration", "*")], "a block id one past the pool passes"),
    ("bounds-slot", "src/reactor/registration.cpp",
     "    if (slot >= 0 && static_cast<std::uint32_t>(slot) >= r.state.slots)",
     "    if (slot >= 0 && static_cast<std::uint32_t>(slot) > r.state.slots)",
     [("test_registration", "*")], "an image slot one past the state memory passes"),
    ("bounds-wrap", "src/reactor/registration.cpp",
     "  const std::uint64_t last = (std::uint64_t{s.tokens.end} + l.chunk_tokens - 1) / l.chunk_tokens;",
     "  const std::uint64_t last = static_cast<std::uint32_t>(s.tokens.end + l.chunk_tokens - 1) / l.chunk_tokens;",
     [("test_registration", "*")], "a range ending near 2^32 wraps to no key"),
    ("bounds-image-flags", "src/server/tier_server.cpp",
     "    if (m.images.size() != m.keys.size())",
     "    if (m.images.size() > m.keys.size())",
     [("test_server", "*")], "a reserve with fewer image flags than keys passes"),
    ("bounds-offset-reserve", "src/reactor/node_tier.cpp",
     "        if (!arena->contains(rr.offsets[i], object_bytes_)) {",
     "        if (false) {",
     [("test_node_tier", "node tier: an arena offset the server grants past the arena*")],
     "a reserved offset past the arena is written"),
    ("bounds-offset-lease", "src/reactor/node_tier.cpp",
     "    if (!lease.arena || !lease.arena->contains(off, object_bytes_)) {",
     "    if (!lease.arena) {",
     [("test_node_tier", "node tier: an arena offset the server grants past the arena*")],
     "a leased offset past the arena is read"),
    ("protocol-type", "src/reactor/node_tier.cpp",
     "    if (static_cast<Type>(h.type & ~kReplyBit) != it->second->type) {",
     "    if (false) {",
     [("test_node_tier", "node tier: a reply of another type*")], "a reply of the wrong type throws in a coroutine"),
    ("planner-spec-tail", "src/kv/layout.hpp",
     "std::uint32_t prefill_tail() const noexcept { return speculative.enabled() ? 2 : 1; }",
     "std::uint32_t prefill_tail() const noexcept { return 1; }",
     [("test_planner_properties", "*")], "the prefill tail is 1 under speculative decoding (F8)"),
    ("planner-no-tail", "src/kv/hit_plan.cpp",
     "  const std::uint32_t limit = in.prompt_tokens > tail ? in.prompt_tokens - tail : 0;",
     "  const std::uint32_t limit = in.prompt_tokens; (void)tail;",
     [("test_planner_properties", "*")], "a hit may cover the whole prompt (F8)"),
    ("pins-count", "src/tier/index.cpp",
     "  if (o.readers++ == 0 && o.committed) --evictable_;",
     "  const bool first = o.readers == 0;\n  o.readers = 1;\n  if (first && o.committed) --evictable_;",
     [("test_index", "*")], "a second pin does not count: one unpin makes the object evictable"),
    ("same-blocks", "src/reactor/connector.cpp",
     "      if (written || (op.kind == TransferKind::load && read))",
     "      if (false)",
     [("test_connector", "connector: a save and a load of the same blocks*")],
     "a save and a load of the same blocks run at once"),
    ("max-live", "src/reactor/connector.cpp",
     "  if (live_.size() + batch.size() > options_.max_live_transfers)",
     "  if (false)",
     [("test_connector", "connector: max_live_transfers*")], "the live-transfer bound is not enforced"),
]

TIMEOUT_S = 120


def run(cmd, cwd, timeout=None):
    return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)


def main(argv):
    if "--list" in argv:
        for name, path, _, _, tests, what in MUTANTS:
            print(f"{name:20} {path:34} {what}")
        return 0
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
    targets = sorted({t for m in chosen for t, _ in m[4]} | {"kvstrand-server", "kvstrand-tier-client"})
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
            b = run(["cmake", "--build", "build", "--target", *sorted({t for t, _ in tests})], scratch)
            if b.returncode != 0:
                verdict, why = "NOT BUILT", b.stdout[-600:]
            else:
                verdict, why = "NOT caught", "every named case passed"
                for binary, filt in tests:
                    try:
                        r = run([os.path.join(build, "tests", binary), filt], scratch, timeout=TIMEOUT_S)
                    except subprocess.TimeoutExpired:
                        verdict, why = "NOT caught", f"{binary} '{filt}' hung past {TIMEOUT_S} s"
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
