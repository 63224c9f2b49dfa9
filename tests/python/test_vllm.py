"""kvstrand.vllm driven through vLLM's documented call order (mini_vllm.py),
against a real kvstrand-server: scheduler and workers are separate
Connectors, the metadata is pickled between them, and every block a request
holds when it finishes is checked against the toy model's KV."""

import time
from types import SimpleNamespace

import pytest

import kvstrand
import kvstrand.vllm as kv_vllm
from mini_vllm import MiniVllm, configs

PREFIX = list(range(1000, 1256))  # four 64-token chunks
needs_sim_hooks = pytest.mark.skipif(not kvstrand.sim.available(), reason="needs the sim backend's stream hooks")


def test_the_interface_is_vllms_or_the_local_copy_of_the_version_cited():
    assert kv_vllm.VLLM_INTERFACE_VERSION == "0.18"
    assert issubclass(kv_vllm.KvstrandConnector, kv_vllm.KVConnectorBase_V1)
    for name in ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
                 "request_finished", "register_kv_caches", "start_load_kv", "wait_for_save", "get_finished",
                 "get_block_ids_with_load_errors", "handle_preemptions", "wait_for_layer_load", "save_kv_layer"):
        assert name in vars(kv_vllm.KvstrandConnector), name


@pytest.mark.parametrize("extra, option", [
    (dict(server_socket=""), "kv_connector_extra_config.server_socket"),
    (dict(chunk_tokens=40), "kv_connector_extra_config.chunk_tokens"),
    (dict(planes_per_layer=3), "kv_connector_extra_config.planes_per_layer"),
    (dict(chunk_size=64), "kv_connector_extra_config.chunk_size"),
    (dict(min_load_tokens="many"), "kv_connector_extra_config.min_load_tokens"),
])
def test_a_configuration_it_cannot_serve_is_refused_at_start_naming_the_option(extra, option):
    vllm_config, kv_cache_config = configs("/nonexistent.sock", 1, 16, 2, 64)
    vllm_config.kv_transfer_config.kv_connector_extra_config.update(extra)
    with pytest.raises(kvstrand.ConfigError) as e:
        kv_vllm.KvstrandConnector(vllm_config, kv_vllm.KVConnectorRole.SCHEDULER, kv_cache_config)
    assert e.value.option == option and option in str(e.value)


def test_two_kv_cache_groups_are_refused_naming_them():
    vllm_config, kv_cache_config = configs("/nonexistent.sock", 1, 16, 2, 64)
    kv_cache_config.kv_cache_groups.append(kv_cache_config.kv_cache_groups[0])
    with pytest.raises(kvstrand.ConfigError) as e:
        kv_vllm.KvstrandConnector(vllm_config, kv_vllm.KVConnectorRole.WORKER, kv_cache_config, tp_rank=0)
    assert e.value.option == "kv_cache_config.kv_cache_groups"


def test_the_scheduler_says_not_known_yet_while_its_lookup_is_pending(server):
    vllm = MiniVllm(server.socket)
    req = vllm.scheduler
    r = SimpleNamespace(request_id="a", prompt_token_ids=PREFIX + [1, 2, 3], num_tokens=259)
    assert req.get_num_new_matched_tokens(r, 0) == (None, False)  # posted, never waited for
    end = time.monotonic() + 10
    while (answer := req.get_num_new_matched_tokens(r, 0))[0] is None:
        assert time.monotonic() < end
        time.sleep(0.002)
    assert answer == (0, False)  # nothing stored yet
    assert req.get_num_new_matched_tokens(r, 0) == (0, False)  # asked again: the same answer
    assert req.request_finished(r, []) == (False, None)
    vllm.shutdown()


@pytest.mark.parametrize("tp", [1, 2])
def test_a_shared_prefix_resumes_from_the_tier_on_every_rank_byte_for_byte(server, tp):
    vllm = MiniVllm(server.socket, tp=tp)
    vllm.add("a", PREFIX + list(range(40)))
    vllm.run()
    assert vllm.stats["resumed"] == 0 and vllm.stats["mismatches"] == 0
    vllm.add("b", PREFIX + list(range(500, 530)))  # the same four chunks, another tail
    vllm.run()
    assert vllm.stats["not_known_yet"] >= 2  # each new request waited for its lookups
    assert vllm.stats["resumed"] == 1 and vllm.stats["loaded_tokens"] == 256
    assert vllm.stats["mismatches"] == 0
    vllm.shutdown()
    # A new vLLM (new scheduler and workers) on the same node resumes from it too.
    again = MiniVllm(server.socket, tp=tp)
    again.add("c", PREFIX + list(range(40)))
    again.run()
    assert again.stats["resumed"] == 1 and again.stats["loaded_tokens"] == 256
    assert again.stats["mismatches"] == 0
    again.shutdown()


def test_a_whole_prompt_hit_still_leaves_a_token_to_compute(server):
    vllm = MiniVllm(server.socket)
    vllm.add("a", PREFIX)
    vllm.run()
    vllm.add("b", PREFIX)
    vllm.run()
    assert vllm.stats["loaded_tokens"] == 192  # the last chunk is computed: its last token must be
    assert vllm.stats["mismatches"] == 0
    vllm.shutdown()


def test_a_lease_a_worker_cannot_adopt_is_reported_as_load_errors_and_recomputed(server):
    vllm = MiniVllm(server.socket, tp=2)
    vllm.add("a", PREFIX + [7])
    vllm.run()
    spoiled = []

    def spoil(meta):
        for job in meta.loads:
            job.handoff[1] = job.handoff[1][:-1]  # rank 1's lease, truncated
            spoiled.append(job.req_id)

    vllm.meta_hook = spoil
    vllm.add("b", PREFIX + [8])
    vllm.run()
    assert spoiled == ["b"]
    assert vllm.stats["load_errors"] == 16  # every block of the load, reported by rank 1
    assert vllm.stats["resumed"] == 0 and vllm.stats["mismatches"] == 0  # recomputed, exactly
    vllm.shutdown()


def test_a_lease_adopted_elsewhere_first_is_a_load_error_not_a_hang(server):
    vllm = MiniVllm(server.socket)
    vllm.add("a", PREFIX + [7])
    vllm.run()
    thief = kvstrand.Connector(server_socket=server.socket)
    thief.register_layout(kvstrand.Registration(vllm.scheduler._scheduler.layouts[0]))

    def steal(meta):
        for job in meta.loads:
            thief.adopt_lease(job.handoff[0])  # another process takes it first
            time.sleep(0.2)

    vllm.meta_hook = steal
    vllm.add("b", PREFIX + [8])
    vllm.run()
    assert vllm.stats["load_errors"] == 16 and vllm.stats["mismatches"] == 0
    thief.close()
    vllm.shutdown()


@needs_sim_hooks
def test_a_finished_requests_blocks_are_freed_only_after_its_saves(server):
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native)
    kvstrand.sim.hold_stream(stream.native)  # the forward passes have not run on the device
    vllm.add("a", PREFIX + [7], max_tokens=1)
    vllm.run(until=lambda: vllm.done)
    assert vllm.done == ["a"]
    assert "a" in vllm.held  # request_finished said: wait for get_finished
    for _ in range(20):
        vllm.step()
    assert "a" in vllm.held  # its saves cannot have read the blocks yet
    kvstrand.sim.release_stream(stream.native)
    vllm.run()
    assert not vllm.held and len(vllm.free) == 64
    vllm.shutdown()


@needs_sim_hooks
def test_preemption_fences_the_requests_transfers_before_its_blocks_are_reused(server):
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native)
    vllm.add("a", PREFIX + list(range(200)), max_tokens=1)
    kvstrand.sim.set_stream_delay(stream.native, 0.3)  # each save waits 0.3 s for its forward pass
    worker = vllm.workers[0]._worker
    vllm.run(until=lambda: worker.saving)
    assert "a" in worker.saving
    vllm.preempt_next = {"a"}
    t0 = time.monotonic()
    vllm.step()  # handle_preemptions fences "a" before this step's forward
    assert time.monotonic() - t0 >= 0.1
    assert "a" not in worker.saving and "a" not in worker.saves_queued
    kvstrand.sim.set_stream_delay(stream.native, 0)
    vllm.run()
    assert vllm.done == ["a"] and vllm.stats["mismatches"] == 0
    vllm.shutdown()


@needs_sim_hooks
def test_a_request_aborted_while_it_loads_keeps_its_blocks_until_the_load_ends(server):
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native)
    vllm.add("a", PREFIX + [7], max_tokens=1)
    vllm.run()
    kvstrand.sim.hold_stream(stream.native)  # the load waits for the engine's stream
    vllm.add("b", PREFIX + [8], max_tokens=1)
    vllm.run(until=lambda: "b" in vllm.workers[0]._worker.loading)
    vllm.abort("b")
    for _ in range(20):
        vllm.step()
    assert "b" in vllm.held  # its load would still write the blocks
    kvstrand.sim.release_stream(stream.native)
    vllm.run()
    assert not vllm.held and len(vllm.free) == 64
    vllm.shutdown()


@needs_sim_hooks
def test_a_preemption_vllm_does_not_announce_is_fenced_when_its_blocks_are_given_out(server):
    # preempted_req_ids left empty: the worker learns of it only when the
    # scheduler gives a's blocks out again (to a itself, re-admitted). Its
    # save, 0.3 s behind its forward pass, must end before they are written,
    # or the tier would keep another position's KV under a's key.
    stream = kvstrand.DeviceStream()
    vllm = MiniVllm(server.socket, stream_provider=lambda: stream.native)
    vllm.announce_preemptions = False
    prompt = PREFIX + list(range(200))
    vllm.add("a", prompt, max_tokens=1)
    kvstrand.sim.set_stream_delay(stream.native, 0.3)
    worker = vllm.workers[0]._worker
    vllm.run(until=lambda: worker.saving)
    vllm.preempt_next = {"a"}
    vllm.step()
    assert "a" in worker.saving  # nobody told the worker
    vllm.run(until=lambda: "a" in vllm.running)
    assert "a" not in worker.saving  # fenced before its blocks' new owner's forward pass
    kvstrand.sim.set_stream_delay(stream.native, 0)
    vllm.run()
    vllm.add("c", prompt, max_tokens=1)  # loads what a stored
    vllm.run()
    assert vllm.stats["resumed"] >= 1 and vllm.stats["mismatches"] == 0
    vllm.shutdown()


def test_a_server_sigkilled_mid_run_costs_only_misses(server):
    # Lookups, saves and loads against a dead server fail; vLLM computes
    # instead, and every block is still exact.
    vllm = MiniVllm(server.socket, tp=2, request_timeout_s=1.0)
    vllm.add("a", PREFIX + [7], max_tokens=1)
    vllm.run()
    for i in range(4):
        vllm.add(f"r{i}", PREFIX + list(range(i * 10, i * 10 + 30)), max_tokens=2)
    vllm.step()
    vllm.step()  # lookups answered, leases handed to the workers: their adoptions and loads now fail
    server.kill()
    vllm.run()
    assert len(vllm.done) == 5 and vllm.stats["mismatches"] == 0
    vllm.shutdown()


def test_wrong_side_calls_are_refused(server):
    vllm = MiniVllm(server.socket)
    with pytest.raises(RuntimeError, match="not a scheduler-side call"):
        vllm.scheduler.register_kv_caches({})
    with pytest.raises(RuntimeError, match="not a worker-side call"):
        vllm.workers[0].build_connector_meta(None)
    vllm.shutdown()
