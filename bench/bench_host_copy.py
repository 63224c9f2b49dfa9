#!/usr/bin/env python3
"""Which engine copies host memory to host memory fastest, for
kvstrand.sglang's choice (docs/sglang.md): 256 MiB between two page-locked
buffers (an SGLang host pool is pinned; the arena is pinned by the
engine's process) by the CPU (one thread, and four threads on four
slices), and by the GPU's copy engine (cudaMemcpyAsync, cudaMemcpyDefault,
one stream and four), each as a ratio to the one-thread CPU copy measured
in the same run. Needs CuPy and a GPU (the GPU host's Python has them).

    python3 bench/bench_host_copy.py [--mib N] [--rounds N]
"""

import argparse
import statistics
import threading
import time

import numpy as np


def median_seconds(fn, rounds):
    fn()  # warm
    runs = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--rounds", type=int, default=7)
    a = p.parse_args()
    import cupy

    n = a.mib << 20
    src_mem, dst_mem = cupy.cuda.alloc_pinned_memory(n), cupy.cuda.alloc_pinned_memory(n)
    src = np.frombuffer(src_mem, dtype=np.uint8, count=n)
    dst = np.frombuffer(dst_mem, dtype=np.uint8, count=n)
    src[:] = np.random.default_rng(1).integers(0, 256, n, dtype=np.uint8)
    rt = cupy.cuda.runtime

    def cpu1():
        np.copyto(dst, src)

    def cpu4():
        step = n // 4
        ts = [threading.Thread(target=np.copyto, args=(dst[i * step:(i + 1) * step], src[i * step:(i + 1) * step]))
              for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(4)]

    def gpu(k):
        def run():
            step = n // k
            for i in range(k):
                rt.memcpyAsync(dst.ctypes.data + i * step, src.ctypes.data + i * step, step, rt.memcpyDefault,
                               streams[i].ptr)
            for s in streams[:k]:
                s.synchronize()
        return run

    base = median_seconds(cpu1, a.rounds)
    print(f"{a.mib} MiB pinned -> pinned, median of {a.rounds}")
    for name, fn in (("CPU, one thread", cpu1), ("CPU, four threads", cpu4), ("GPU copy engine, one stream", gpu(1)),
                     ("GPU copy engines, four streams", gpu(4))):
        dst[:] = 0
        s = median_seconds(fn, a.rounds)
        assert np.array_equal(dst, src)
        print(f"{name:32} {s * 1e3:8.1f} ms  {n / s / 1e9:6.2f} GB/s  {base / s:5.2f}")


if __name__ == "__main__":
    main()
