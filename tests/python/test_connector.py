"""The Connector through the module, on the sim backend's embedded tier:
round trips byte for byte, fences, fail-stop as its own exception, refusals,
and the GIL released while the library waits."""

import threading
import time

import numpy as np
import pytest

import kvstrand
from conftest import BLOCK_BYTES, Engine, make_layout, pattern

PROMPT = list(range(5000, 5128))  # two 64-token chunks


def test_save_then_load_restores_the_blocks_byte_for_byte(engine):
    engine.blocks[0:8] = pattern(8 * BLOCK_BYTES, 1).reshape(8, BLOCK_BYTES)
    engine.conn.save(engine.spec("r", PROMPT, 0, 128))
    got = engine.wait(saves=1)
    assert got["saves"][0].ok and got["saves"][0].error is None
    assert sorted(b for s in got["source_safe"] for b in s.blocks) == list(range(8))

    lookup = engine.conn.lookup(engine.keys(PROMPT), engine.group)
    answer = engine.wait(lookups=1)["lookups"][0]
    assert answer.id == lookup and answer.hit.tokens == 128  # (the embedded tier takes no lease)

    assert not engine.blocks[16:24].any()
    engine.conn.load(engine.spec("r", PROMPT, 16, 128, tier_lease=answer.lease))
    load = engine.wait(loads=1)["loads"][0]
    assert load.ok and load.kind == kvstrand.TransferKind.load and load.tokens == kvstrand.TokenRange(0, 128)
    np.testing.assert_array_equal(engine.blocks[16:24], engine.blocks[0:8])


def test_a_step_submits_several_transfers_at_once_and_a_refused_one_posts_none(engine):
    engine.blocks[0:8] = pattern(8 * BLOCK_BYTES, 2).reshape(8, BLOCK_BYTES)
    other = list(range(9000, 9128))
    good = kvstrand.Op(kvstrand.TransferKind.save, engine.spec("a", PROMPT, 0, 128))
    bad = kvstrand.Op(kvstrand.TransferKind.save, engine.spec("b", other, 4, 128))
    bad.spec.blocks = [0] * 7  # one block short of the range
    with pytest.raises(kvstrand.TransferRefused) as e:
        engine.conn.submit([good, bad])
    assert e.value.code == kvstrand.TransferErrc.bad_spec
    time.sleep(0.05)
    assert engine.conn.finished().empty()  # nothing of the step was posted
    engine.conn.submit([good, kvstrand.Op(kvstrand.TransferKind.save, engine.spec("b", other, 8, 128))])
    assert all(s.ok for s in engine.wait(saves=2)["saves"])


def test_fence_returns_once_the_requests_are_terminal(engine):
    engine.conn.save(engine.spec("r", PROMPT, 0, 128))
    engine.conn.fence(["r"], 10.0)
    f = engine.conn.finished()
    assert [s.request for s in f.saves] == ["r"] and f.saves[0].ok
    engine.conn.fence(["nothing-live"], 0.001)  # nothing to wait for
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        engine.conn.fence(["r"], -1)  # refused, not an immediate fail-stop
    engine.conn.finished()


def test_fence_releases_the_gil_while_it_waits():
    # The save waits for the engine's stream, held; another Python thread
    # releases it. If fence kept the GIL that thread could not run, and the
    # fence would time out into FailStop.
    e = Engine(transfer_deadline=20.0)
    stream = kvstrand.DeviceStream()
    kvstrand.sim.hold_stream(stream.native)
    e.conn.save(e.spec("r", PROMPT, 0, 128), kvstrand.Producer.after_stream(stream.native))
    releaser = threading.Timer(0.2, kvstrand.sim.release_stream, args=(stream.native,))
    releaser.start()
    t0 = time.monotonic()
    e.conn.fence(["r"], 10.0)
    assert time.monotonic() - t0 >= 0.15
    assert e.conn.finished().saves[0].ok
    releaser.join()
    e.close()


def test_a_deadline_passed_is_fail_stop_raised_by_every_later_call():
    e = Engine(transfer_deadline=0.2)
    stream = kvstrand.DeviceStream()
    kvstrand.sim.hold_stream(stream.native)  # the producer never completes
    e.conn.save(e.spec("r", PROMPT, 0, 128), kvstrand.Producer.after_stream(stream.native))
    end = time.monotonic() + 10
    with pytest.raises(kvstrand.FailStop) as first:
        while time.monotonic() < end:
            e.conn.finished()
            time.sleep(0.01)
    assert first.value.code == kvstrand.TransferErrc.deadline_exceeded
    assert "restart the process" in str(first.value)
    assert isinstance(first.value, kvstrand.KvstrandError)
    # Never once and then silence.
    for call in (e.conn.finished, lambda: e.conn.fence(["r"], 1.0),
                 lambda: e.conn.save(e.spec("s", PROMPT, 8, 128))):
        with pytest.raises(kvstrand.FailStop):
            call()
    assert e.conn.never_ended == 0  # not closed yet
    e.close()
    # Its producer never completed, so its copy was never queued: nothing can
    # touch e's memory, and it may be freed (a held tier stream counts 1:
    # test_connector.cpp, "F13: close() counts the copies it never saw end").
    assert e.conn.never_ended == 0
    kvstrand.sim.release_stream(stream.native)


def test_a_fence_that_times_out_is_fail_stop():
    e = Engine(transfer_deadline=20.0)
    stream = kvstrand.DeviceStream()
    kvstrand.sim.hold_stream(stream.native)
    e.conn.save(e.spec("r", PROMPT, 0, 128), kvstrand.Producer.after_stream(stream.native))
    with pytest.raises(kvstrand.FailStop) as f:
        e.conn.fence(["r"], 0.1)
    assert f.value.code == kvstrand.TransferErrc.fence_timeout
    kvstrand.sim.release_stream(stream.native)
    e.close()


def test_a_save_waits_for_the_engines_stream_and_stores_what_the_step_wrote():
    e = Engine()
    plane = kvstrand.DeviceMemory(32 * BLOCK_BYTES)
    g = e.conn.register_layout(kvstrand.Registration(make_layout(), [kvstrand.PlaneMemory(plane.address, 32)]))
    before, step = pattern(8 * BLOCK_BYTES, 3), pattern(8 * BLOCK_BYTES, 4)
    plane.write(0, before)
    stream = kvstrand.DeviceStream()
    kvstrand.sim.hold_stream(stream.native)
    plane.write_async(0, step, stream)  # the step's forward pass, not run yet
    spec = e.spec("r", PROMPT, 0, 128)
    spec.registration = g
    e.conn.save(spec, kvstrand.Producer.after_stream(stream.native))
    time.sleep(0.05)
    assert not e.conn.finished().saves  # waiting for the forward pass
    kvstrand.sim.release_stream(stream.native)
    assert e.wait(saves=1)["saves"][0].ok
    load = e.spec("r", PROMPT, 16, 128)
    load.registration = g
    e.conn.load(load)
    assert e.wait(loads=1)["loads"][0].ok
    assert plane.read(16 * BLOCK_BYTES, 8 * BLOCK_BYTES) == step.tobytes()
    stream.synchronize()
    e.close()


def test_refusals_carry_their_code_and_post_nothing(engine):
    spec = engine.spec("r", PROMPT, 0, 128)
    spec.registration = 3
    with pytest.raises(kvstrand.TransferRefused) as e:
        engine.conn.save(spec)
    assert e.value.code == kvstrand.TransferErrc.bad_spec and "registration 3" in str(e.value)
    stream = kvstrand.DeviceStream()
    kvstrand.sim.hold_stream(stream.native)  # keeps the save live while the next calls are refused
    engine.conn.save(engine.spec("r", PROMPT, 0, 128), kvstrand.Producer.after_stream(stream.native))
    with pytest.raises(kvstrand.TransferRefused) as e:
        engine.conn.save(engine.spec("r", PROMPT, 8, 128))
    assert e.value.code == kvstrand.TransferErrc.duplicate_transfer
    with pytest.raises(kvstrand.TransferRefused) as e:
        engine.conn.load(engine.spec("x", PROMPT, 0, 128))  # blocks the live save reads
    assert e.value.code == kvstrand.TransferErrc.blocks_in_use
    kvstrand.sim.release_stream(stream.native)
    assert [s.request for s in engine.wait(saves=1)["saves"]] == ["r"]


def test_options_kvstrand_cannot_serve_are_refused_naming_them():
    with pytest.raises(kvstrand.ConfigError) as e:
        kvstrand.Connector(transfer_deadline=0)
    assert e.value.option == "transfer_deadline"
    with pytest.raises(kvstrand.ConfigError) as e:
        kvstrand.Connector(kvstrand.ConnectorOptions(debug_port=70000))
    assert e.value.option == "debug_port"
    with pytest.raises(TypeError, match="unknown option 'deadline'"):
        kvstrand.Connector(deadline=1.0)
    with pytest.raises(TypeError):
        kvstrand.Connector(transfer_deadline="soon")
    o = kvstrand.ConnectorOptions(transfer_deadline=2.5)
    assert o.transfer_deadline == 2.5
    with pytest.raises(kvstrand.ConfigError) as e:
        kvstrand.Connector(reactor_idle_spin=-0.001)
    assert e.value.option == "reactor_idle_spin"
    assert kvstrand.ConnectorOptions().reactor_idle_spin == 0.002
    assert kvstrand.ConnectorOptions(reactor_idle_spin=0).reactor_idle_spin == 0
    with pytest.raises(kvstrand.ConfigError) as e:
        kvstrand.Connector(load_path="fastest")
    assert e.value.option == "load_path"
    assert kvstrand.ConnectorOptions().load_path == "rule"
    assert kvstrand.ConnectorOptions(load_path="dma-batch").load_path == "dma-batch"


def test_a_reactor_that_sleeps_at_once_still_takes_every_call():
    # reactor_idle_spin=0: every call after the reactor went idle wakes it.
    conn = kvstrand.Connector(tier_bytes=64 << 20, reactor_idle_spin=0)
    layout = kvstrand.Layout(model_id="m", layout_name="l", planes=[kvstrand.Plane("kv", 4096)], block_tokens=16,
                             chunk_tokens=64, dtype="bf16")
    memory = kvstrand.sim.allocate(64 * 4096) if kvstrand.sim.available() else kvstrand.DeviceMemory(64 * 4096)
    group = conn.register_layout(kvstrand.Registration(layout, [kvstrand.PlaneMemory(memory.address, 64)]))
    keys = kvstrand.chunk_keys(layout, list(range(64)))
    for i in range(5):
        conn.save(kvstrand.TransferSpec(request=f"r{i}", registration=group, tokens=kvstrand.TokenRange(0, 64),
                                        keys=keys, blocks=[0, 1, 2, 3]))
        conn.fence([f"r{i}"], 10.0)
        assert [s.request for s in conn.finished().saves] == [f"r{i}"]
        time.sleep(0.01)  # the reactor goes back to sleep
    conn.close()


def test_a_load_of_chunks_the_tier_lacks_fails_naming_exactly_its_blocks(engine):
    engine.conn.load(engine.spec("r", list(range(64, 192)), 16, 128))
    load = engine.wait(loads=1)["loads"][0]
    assert not load.ok
    assert load.error == kvstrand.TransferErrc.missing_chunk
    assert load.blocks == list(range(16, 24))
    assert [o.request for o in engine.seen[-1].failed_loads()] == ["r"]


def test_invalidate_drops_the_namespace_and_returns_how_many_objects(engine):
    engine.conn.save(engine.spec("r", PROMPT, 0, 128))
    assert engine.wait(saves=1)["saves"][0].ok

    def hit():
        engine.conn.lookup(engine.keys(PROMPT), engine.group)
        return engine.wait(lookups=1)["lookups"][0].hit.tokens

    assert hit() == 128
    assert engine.conn.invalidate(engine.group) == 2
    assert hit() == 0
    with pytest.raises(kvstrand.TransferRefused) as e:
        engine.conn.invalidate(99)
    assert e.value.code == kvstrand.TransferErrc.not_registered


def test_a_registration_without_memory_serves_lookups_only(engine):
    planner = engine.conn.register_layout(kvstrand.Registration(make_layout(model_id="planner")))
    spec = engine.spec("r", PROMPT, 0, 128)
    spec.registration = planner
    with pytest.raises(kvstrand.TransferRefused, match="serves lookups only"):
        engine.conn.save(spec)
    engine.conn.lookup(engine.keys(PROMPT), planner)
    assert engine.wait(lookups=1)["lookups"][0].hit.tokens == 0


def test_the_debug_endpoint_can_be_turned_on():
    e = Engine(debug_port=0)
    assert e.conn.debug_port > 0
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{e.conn.debug_port}/healthz", timeout=5) as r:
        assert r.status == 200
    e.close()


def test_close_is_idempotent_and_later_calls_are_refused(engine):
    engine.conn.close()
    engine.conn.close()
    assert engine.conn.never_ended == 0
    with pytest.raises(kvstrand.TransferRefused) as e:
        engine.conn.save(engine.spec("r", PROMPT, 0, 128))
    assert e.value.code == kvstrand.TransferErrc.closed


def test_a_connector_is_a_context_manager():
    with kvstrand.Connector(tier_bytes=4 << 20) as c:
        assert c.debug_port == 0
    with pytest.raises(kvstrand.TransferRefused):
        c.register_layout(kvstrand.Registration(make_layout()))
