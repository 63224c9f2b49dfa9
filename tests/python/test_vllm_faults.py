"""kvstrand.vllm under vLLM's failures (mini_vllm.py, a real
kvstrand-server): loads that fail or whose lease cannot be adopted, finished
and preempted requests whose blocks stay held until their transfers end,
aborts while loading, looking up or saving, preemptions vLLM does not
announce, reset_cache, a server SIGKILLed mid-run, wrong-side calls."""

import time
from types import SimpleNamespace

import pytest

import kvstrand
from mini_vllm import MiniVllm, Request
from vllm_cases import HYBRID, PREFIX, needs_sim_hooks, newest_only, spoil_leases


def test_a_lease_a_worker_cannot_adopt_is_reported_as_load_errors_and_recomputed(server):
    vllm = MiniVllm(server.socket, tp=2, caching=False)
    vllm.add("a", PREFIX + [7])
    vllm.run()
    spoiled = []
    vllm.meta_hook = spoil_leases(1, spoiled)
    vllm.add("b", PREFIX + [8])
    vllm.run()
    assert spoiled and set(spoiled) == {"b"}
    assert vllm.stats["load_errors"] >= 1
    assert vllm.stats["resumed"] == 0 and vllm.stats["mismatches"] == 0  # recomputed, exactly
    assert vllm.all_blocks_free()
    vllm.shutdown()


def test_under_vllms_default_policy_fail_a_failed_load_fails_its_request_and_the_engine_goes_on(server):
    # "fail" is vLLM's default kv_load_failure_policy: it was refused at
    # start-up, so `vllm serve` without that one key did not start.
    vllm = MiniVllm(server.socket, caching=False, policy="fail")
    vllm.add("a", PREFIX + [7])
    vllm.run()
    spoiled = []
    vllm.meta_hook = spoil_leases(0, spoiled)
    vllm.add("b", PREFIX + [8])
    vllm.run()
    assert spoiled == ["b"] and vllm.errored == ["b"]  # vLLM ended it in an error
    vllm.meta_hook = None
    vllm.add("c", PREFIX + [9])  # and goes on: the next request resumes from the tier
    vllm.run()
    assert vllm.done == ["a", "c"] and vllm.stats["resumed"] >= 1 and vllm.stats["mismatches"] == 0
    assert vllm.all_blocks_free()
    vllm.shutdown()


def test_a_failed_load_is_counted_failed_and_loads_no_tokens(server):
    # vLLM's log and Prometheus read loaded_tokens: a load that failed
    # brought nothing (every attempt here fails on the one rank).
    vllm = MiniVllm(server.socket, caching=False)
    vllm.add("a", PREFIX + [7])
    vllm.run()
    vllm.meta_hook = spoil_leases(0, [])
    vllm.add("b", PREFIX + [8])
    vllm.run()
    stats = vllm.summed_stats()
    assert stats["loads"] >= 1 and stats["loads_failed"] == stats["loads"] and stats["loaded_tokens"] == 0
    assert vllm.stats["resumed"] == 0 and vllm.stats["mismatches"] == 0
    vllm.shutdown()


def test_a_request_whose_loads_keep_failing_is_offered_no_more_hits(server):
    # A load failing from its first block makes vLLM free the blocks and ask
    # again; without a bound that repeats for as long as the tier answers.
    vllm = MiniVllm(server.socket, caching=False, max_load_failures=2)
    vllm.add("a", PREFIX + [7])
    vllm.run()
    spoiled = []
    vllm.meta_hook = spoil_leases(0, spoiled)
    vllm.add("b", PREFIX + [8])
    vllm.run(timeout=20)
    assert spoiled == ["b", "b"] and vllm.stats["load_errors"] == 2
    assert vllm.done == ["a", "b"] and vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    assert vllm.summed_stats()["loads_failed"] == 2
    vllm.shutdown()


def test_a_lease_adopted_elsewhere_first_is_a_load_error_not_a_hang(server):
    vllm = MiniVllm(server.socket, caching=False)
    vllm.add("a", PREFIX + [7])
    vllm.run()
    thief = kvstrand.Connector(server_socket=server.socket)
    thief.register_layout(kvstrand.Registration(vllm.scheduler._scheduler.layouts[0][0]))

    def steal(meta):
        for job in meta.loads:
            thief.adopt_lease(job.parts[0].handoff[0])  # another process takes it first
            time.sleep(0.2)

    vllm.meta_hook = steal
    vllm.add("b", PREFIX + [8])
    vllm.run()
    assert vllm.stats["load_errors"] >= 1 and vllm.stats["mismatches"] == 0
    thief.close()
    vllm.shutdown()


def held_until_the_stream_runs(vllm, stream, req_id):
    """With `stream` held, `req_id`'s blocks stay vLLM's to keep however many
    steps pass; once it runs, every block goes back to the pool once."""
    for _ in range(20):
        vllm.step()
    assert req_id in vllm.held()
    kvstrand.sim.release_stream(stream.native)
    vllm.run()
    assert vllm.all_blocks_free()


@needs_sim_hooks
def test_a_finished_requests_blocks_are_freed_only_after_its_saves(server):
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native)
    kvstrand.sim.hold_stream(stream.native)  # the forward passes have not run on the device
    vllm.add("a", PREFIX + [7], max_tokens=1)
    vllm.run(until=lambda: vllm.done)
    assert vllm.done == ["a"]
    assert "a" in vllm.held()  # request_finished said: wait for get_finished
    held_until_the_stream_runs(vllm, stream, "a")  # its saves cannot have read the blocks yet
    vllm.shutdown()


@needs_sim_hooks
def test_preemption_fences_the_requests_transfers_before_its_blocks_are_reused(server):
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native)
    vllm.add("a", PREFIX + list(range(200)), max_tokens=1)
    kvstrand.sim.set_stream_delay(stream.native, 0.3)  # each save waits 0.3 s for its forward pass
    worker = vllm.workers[0]._worker
    vllm.run(until=lambda: worker.saves_queued.get("a"))  # one save live, the next queued behind it
    assert "a" in worker.saving
    vllm.preempt_next = {"a"}
    t0 = time.monotonic()
    vllm.step()  # the fence runs before this step's forward; the queued save is dropped, never posted
    assert time.monotonic() - t0 >= 0.1
    assert "a" not in worker.saving and "a" not in worker.saves_queued
    kvstrand.sim.set_stream_delay(stream.native, 0)
    vllm.run()
    assert vllm.done == ["a"] and vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    vllm.shutdown()


@needs_sim_hooks
def test_a_request_aborted_while_it_loads_ends_with_every_block_freed_once(server):
    # vLLM keeps an aborted request that waits for remote KV until
    # finished_recving, then frees and deletes it; a connector that also
    # asked to delay (request_finished -> True) would report it as sent
    # afterwards and trip vLLM's assertion on an unknown request.
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native, caching=False)
    vllm.add("a", PREFIX + [7], max_tokens=1)
    vllm.run()
    kvstrand.sim.hold_stream(stream.native)  # the load waits for the engine's stream
    vllm.add("b", PREFIX + [8], max_tokens=1)
    vllm.run(until=lambda: "b" in vllm.workers[0]._worker.loading)
    vllm.abort("b")
    held_until_the_stream_runs(vllm, stream, "b")  # its load would still write the blocks
    vllm.shutdown()


@needs_sim_hooks
def test_a_preempted_request_aborted_while_it_reloads_its_own_chunks_is_freed_once(server):
    # a saved chunks, was preempted, and is re-admitted with a load of what
    # it saved: saves were posted for it, and still request_finished must
    # leave the free to vLLM while the load is in flight.
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native, caching=False)
    vllm.add("a", PREFIX + list(range(100)), max_tokens=1)
    vllm.run(until=lambda: vllm.requests["a"].num_computed_tokens >= 256)
    vllm.step()
    vllm.preempt_next = {"a"}
    vllm.step()  # its saves fenced: stored
    kvstrand.sim.hold_stream(stream.native)
    vllm.run(until=lambda: "a" in vllm.workers[0]._worker.loading)
    vllm.abort("a")
    held_until_the_stream_runs(vllm, stream, "a")
    vllm.shutdown()


def wait_for(condition, timeout=10.0):
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "not reached in time"
        time.sleep(0.01)


def test_a_lookup_answered_after_its_request_ended_gives_its_lease_back(server):
    vllm = MiniVllm(server.socket, tp=2, caching=False)
    vllm.add("a", PREFIX + [1])
    vllm.run()
    scheduler = vllm.scheduler
    r = Request("b", PREFIX + [2], 2)
    assert scheduler.get_num_new_matched_tokens(r, 0) == (None, False)  # a lookup per rank posted
    assert scheduler.request_finished(r, []) == (False, None)  # aborted before any answer
    idle = SimpleNamespace(scheduled_new_reqs=[], num_scheduled_tokens={}, scheduled_cached_reqs=SimpleNamespace(
        req_ids=[], new_block_ids=[], num_computed_tokens=[]))
    side = scheduler._scheduler
    wait_for(lambda: scheduler.build_connector_meta(idle) and not side.by_lookup)  # every answer drained
    wait_for(lambda: server.tier()["leases"] == 0)  # each given back on arrival (a release is posted, not awaited)
    # Asked about again, then finished with its first answers unused.
    r = Request("c", PREFIX + [3], 2)
    wait_for(lambda: scheduler.get_num_new_matched_tokens(r, 0)[0] is not None)
    assert server.tier()["leases"] == 2  # one per rank, held for the load vLLM may decide
    assert scheduler.request_finished(r, []) == (False, None)
    wait_for(lambda: server.tier()["leases"] == 0)
    vllm.shutdown()


def test_requests_aborted_while_looked_up_and_while_saving_free_their_blocks(server):
    vllm = MiniVllm(server.socket, caching=False)
    vllm.add("a", PREFIX + list(range(100)), max_tokens=4)
    vllm.step()
    vllm.step()  # its lookup answered; now computing
    vllm.add("b", PREFIX + [1])
    vllm.step()  # b's lookups posted: not known yet
    vllm.abort("b")
    vllm.abort("a")
    vllm.run()
    assert vllm.all_blocks_free() and vllm.stats["mismatches"] == 0
    vllm.shutdown()


@needs_sim_hooks
def test_a_preemption_vllm_does_not_announce_is_fenced_when_its_blocks_are_given_out(server):
    # preempted_req_ids left empty: the worker learns of it only when the
    # scheduler gives a's old blocks out again (here to a itself, re-admitted
    # and growing through the 13-block pool). Its first save, 0.5 s behind its
    # forward pass, must end before they are written, or the tier would keep
    # another position's KV under a's key.
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native, caching=False, num_blocks=14)
    vllm.announce_preemptions = False
    prompt = PREFIX[:128] + list(range(32))
    vllm.add("a", prompt, max_tokens=1)
    kvstrand.sim.set_stream_delay(stream.native, 0.5)
    worker = vllm.workers[0]._worker
    vllm.run(until=lambda: worker.saving)
    vllm.preempt_next = {"a"}
    vllm.step()
    assert "a" in worker.saving  # nobody told the worker
    vllm.run(until=lambda: vllm.done)
    kvstrand.sim.set_stream_delay(stream.native, 0)
    vllm.run()
    vllm.add("c", prompt, max_tokens=1)  # loads what a stored: at least the chunk its old blocks held
    vllm.run()
    assert vllm.stats["resumed"] == 1 and vllm.stats["loaded_tokens"] >= 64
    assert vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    vllm.shutdown()


@pytest.mark.parametrize("tp", [1, 2])
def test_preemptions_inside_allocation_reuse_blocks_in_the_same_step_and_stay_exact(server, tp):
    vllm = MiniVllm(server.socket, tp=tp, num_blocks=40, budget=96)
    for i in range(4):
        vllm.add(f"r{i}", PREFIX[:128] + list(range(i * 300, i * 300 + 100)), max_tokens=60)
    vllm.run(timeout=60)
    assert vllm.stats["preempted"] >= 1  # blocks ran out: vLLM took some back
    assert len(vllm.done) == 4 and vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    vllm.shutdown()


def test_reset_cache_stops_reading_what_was_stored_before(server):
    vllm = MiniVllm(server.socket, caching=False)
    vllm.add("a", PREFIX + [1])
    vllm.run()
    assert vllm.scheduler.reset_cache() is True
    vllm.add("b", PREFIX + [2])
    vllm.run()
    assert vllm.stats["resumed"] == 0  # a's chunks are of the old epoch
    vllm.add("c", PREFIX + [3])
    vllm.run()
    assert vllm.stats["resumed"] == 1 and vllm.stats["mismatches"] == 0  # b's are of the new one
    vllm.shutdown()


@pytest.mark.parametrize("drop", [False, True])
def test_drop_on_reset_frees_the_node_tier_for_every_engine(server, drop):
    # Another engine of the same model (a fresh key epoch, as after a
    # restart) resumes what the first stored, unless its reset dropped it.
    first = MiniVllm(server.socket, caching=False, drop_on_reset=drop)
    first.add("a", PREFIX + [1])
    first.run()
    assert first.scheduler.reset_cache() is True
    first.shutdown()
    second = MiniVllm(server.socket, caching=False)
    second.add("a", PREFIX + [1])
    second.run()
    assert second.stats["resumed"] == (0 if drop else 1) and second.stats["mismatches"] == 0
    second.shutdown()


@newest_only
def test_drop_on_reset_drops_every_kv_cache_groups_objects(server):
    # A hybrid's groups register a namespace each: a reset that dropped the
    # first group's alone left the sliding-window group's objects stored.
    vllm = MiniVllm(server.socket, caching=False, drop_on_reset=True, groups=HYBRID)
    vllm.add("a", PREFIX + [1])
    vllm.run()
    assert server.tier()["objects"] > 0
    assert vllm.scheduler.reset_cache() is True
    assert server.tier()["objects"] == 0
    vllm.shutdown()


def test_a_server_sigkilled_mid_run_costs_only_misses(server):
    # Lookups, saves and loads against a dead server fail; vLLM computes
    # instead, and every block is still exact.
    vllm = MiniVllm(server.socket, tp=2, request_timeout_s=1.0, caching=False)
    vllm.add("a", PREFIX + [7], max_tokens=1)
    vllm.run()
    for i in range(4):
        vllm.add(f"r{i}", PREFIX + list(range(i * 10, i * 10 + 30)), max_tokens=2)
    vllm.step()
    vllm.step()  # lookups answered, leases handed to the workers: their adoptions and loads now fail
    server.kill()
    vllm.run()
    assert len(vllm.done) == 5 and vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    vllm.shutdown()


def test_wrong_side_calls_are_refused(server):
    vllm = MiniVllm(server.socket)
    with pytest.raises(RuntimeError, match="not a scheduler-side call"):
        vllm.scheduler.register_kv_caches({})
    with pytest.raises(RuntimeError, match="not a worker-side call"):
        vllm.workers[0].build_connector_meta(SimpleNamespace())
    vllm.shutdown()


@newest_only
@needs_sim_hooks
def test_vllm_waits_for_blocks_a_finished_requests_saves_hold_instead_of_preempting(server):
    # a finished; its saves wait for a held stream, so vLLM keeps its 9
    # blocks. b grows past what is left: before, vLLM had to preempt b (the
    # connector did not answer has_pending_block_frees); now it waits a step
    # at a time until a's saves end and its blocks come back.
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native, num_blocks=24, caching=False)
    kvstrand.sim.hold_stream(stream.native)
    vllm.add("a", PREFIX[:128] + [1], max_tokens=1)
    vllm.run(until=lambda: vllm.done)
    assert "a" in vllm.held() and vllm.scheduler.has_pending_block_frees()
    vllm.add("b", list(range(3000, 3208)), max_tokens=40)
    vllm.run(until=lambda: vllm.waited_for_frees >= 3)
    assert vllm.stats["preempted"] == 0
    kvstrand.sim.release_stream(stream.native)
    vllm.run()
    assert vllm.done == ["a", "b"] and vllm.stats["preempted"] == 0 and not vllm.scheduler.has_pending_block_frees()
    assert vllm.stats["mismatches"] == 0 and vllm.all_blocks_free()
    vllm.shutdown()
