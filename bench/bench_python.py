#!/usr/bin/env python3
"""What the Python module costs an engine's step thread, against baselines
measured in the same run:

  finished() with nothing to drain        vs a Python call to a no-op function
  chunk_keys of a prompt, numpy uint32     vs the same prompt as a list (converted element by element)
  one step's submit() of 8 saves           vs building those 8 TransferSpecs and Ops in Python

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_python.py [--iterations N]
"""

import argparse
import statistics
import time

import numpy as np

import kvstrand


def per_call(fn, n):
    """Median of 5 runs of n calls, in microseconds per call."""
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(runs)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=20000)
    n = p.parse_args().iterations

    layout = kvstrand.Layout(model_id="bench", layout_name="bench", planes=[kvstrand.Plane("kv", 4096)],
                             block_tokens=16, chunk_tokens=64, dtype="bf16")
    memory = kvstrand.sim.allocate(512 * 4096) if kvstrand.sim.available() else kvstrand.DeviceMemory(512 * 4096)
    conn = kvstrand.Connector(tier_bytes=256 << 20, transfer_deadline=30.0)
    group = conn.register_layout(kvstrand.Registration(layout, [kvstrand.PlaneMemory(memory.address, 512)]))
    rows = []

    def noop():
        return None

    rows.append(("finished(), nothing to drain", per_call(conn.finished, n), "a no-op Python call",
                 per_call(noop, n)))

    prompt = list(range(8192))
    array = np.asarray(prompt, dtype=np.uint32)
    rows.append(("chunk_keys, 8192 tokens as numpy uint32", per_call(lambda: kvstrand.chunk_keys(layout, array), n // 100),
                 "the same as a list", per_call(lambda: kvstrand.chunk_keys(layout, prompt), n // 100)))

    keys = kvstrand.chunk_keys(layout, array)

    def specs(step):
        return [kvstrand.TransferSpec(request=f"s{step}-{i}", registration=group, tokens=kvstrand.TokenRange(0, 64),
                                      keys=[keys[(step * 8 + i) % len(keys)]],
                                      blocks=list(range(i * 4, i * 4 + 4))) for i in range(8)]

    step = [0]

    def build_only():
        step[0] += 1
        return specs(step[0])

    def submit_only(steps):
        """Median time of submit() alone; the saves are fenced and drained outside the timing."""
        times = []
        for _ in range(steps):
            step[0] += 1
            ops = [kvstrand.Op(kvstrand.TransferKind.save, s) for s in specs(step[0])]
            t0 = time.perf_counter()
            conn.submit(ops)
            times.append((time.perf_counter() - t0) * 1e6)
            conn.fence([f"s{step[0]}-{i}" for i in range(8)], 10.0)
            conn.finished()
        return statistics.median(times)

    steps = max(200, n // 20)
    rows.append(("submit() of a step's 8 saves (posting only)", submit_only(steps), "building the 8 specs and ops",
                 per_call(lambda: [kvstrand.Op(kvstrand.TransferKind.save, s) for s in build_only()], steps)))

    conn.close()
    print(f"kvstrand {kvstrand.__version__} ({kvstrand.backend()}), Python module per-call costs (median of 5 runs)")
    print(f"{'operation':52} {'us':>9}   {'baseline':36} {'us':>9} {'ratio':>7}")
    for what, us, base, base_us in rows:
        print(f"{what:52} {us:9.2f}   {base:36} {base_us:9.2f} {us / base_us:7.2f}")


if __name__ == "__main__":
    main()
