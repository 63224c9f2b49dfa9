#!/usr/bin/env python3
"""kvstrand.sglang's data path: batch_set_v1 and batch_get_v1 of 128 pages
of a Llama-3-8B-shaped page_first host pool (32 layers, 8 KV heads of 128,
bf16, 16-token pages: 2 MiB a page, 256 MiB a batch) through a real
kvstrand-server, each as a ratio to one memcpy of the same bytes (NumPy's
copy between two host buffers) measured in the same run; with the caller's
thread alone and with copy helpers.

    PYTHONPATH=build/python /usr/bin/python3 bench/bench_sglang.py [--rounds N] [--server PATH]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python", "sglang_pictures", "newest"))

from sglang_host_pools import MHAHostPool  # noqa: E402

PAGE, PAGES, BATCH = 16, 160, 128
WARM = 7  # rounds of 256 MiB: once over the 1536 MiB arena
LAYERS, HEADS, ELEM = 32, 8, 128 * 2


def start_server(binary, socket):
    p = subprocess.Popen([binary, "--socket", socket, "--tier-bytes", "1536M", "--slab-bytes", "64M",
                          "--chunk-tokens", str(PAGE), "--log-level", "info"], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    for line in p.stdout:
        if "slabs are ready" in line:
            return p
    raise SystemExit("kvstrand-server did not become ready")


def seconds(fn, rounds):
    runs = []
    for r in range(rounds):
        t0 = time.perf_counter()
        fn(r)
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--server", default=os.environ.get("KVSTRAND_SERVER", os.path.join(HERE, "..", "build",
                                                                                        "kvstrand-server")))
    a = p.parse_args()
    from kvstrand.sglang import KvstrandStorage
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    tmp = tempfile.mkdtemp(prefix="kvs-bench-", dir="/tmp")
    socket = os.path.join(tmp, "tier.sock")
    server = start_server(a.server, socket)
    try:
        src = MHAHostPool("page_first", PAGES, PAGE, LAYERS, HEADS, ELEM)
        dst = MHAHostPool("page_first", PAGES, PAGE, LAYERS, HEADS, ELEM)
        src.kv_buffer[...] = np.random.default_rng(1).integers(0, 256, src.kv_buffer.shape, dtype=np.uint8)
        batch_bytes = BATCH * 2 * PAGE * LAYERS * HEADS * ELEM
        n = BATCH * PAGE

        def memcpy(_):
            np.copyto(dst.kv_buffer[:, :n], src.kv_buffer[:, :n])

        base = seconds(memcpy, a.rounds)
        print(f"one batch: {BATCH} pages of {batch_bytes // BATCH >> 10} KiB = {batch_bytes >> 20} MiB")
        print(f"memcpy (NumPy, one thread)        {base * 1e3:8.1f} ms  {batch_bytes / base / 1e9:6.2f} GB/s  1.00")
        for threads in (0, 3):
            cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                       is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                                       model_name=f"bench-{threads}",
                                       extra_config={"server_socket": socket, "interface_v1": 1,
                                                     "copy_threads": threads})
            writer, reader = KvstrandStorage(cfg, {}), KvstrandStorage(cfg, {})
            writer.register_mem_pool_host(src)
            reader.register_mem_pool_host(dst)
            idx = np.arange(n)

            def keys(r):
                return [f"{threads:02x}{r:06x}{i:056x}" for i in range(BATCH)]

            def put(r):
                assert all(writer.batch_set_v1(keys(r), idx))

            def get(r):
                assert reader.batch_exists(keys(r)) == BATCH
                assert all(reader.batch_get_v1(keys(r), idx))

            # Each round reads back what it just wrote (rounds of 256 MiB
            # soon pass the tier's size). The first WARM rounds go once
            # over the whole arena: until then a copy also pays for mapping
            # the arena's pages into this process (the server populated
            # them; this process's page tables are filled as its pinning
            # reaches them), a once-per-process cost, printed apart.
            puts, gets = [], []
            for r in range(WARM + a.rounds):
                puts.append(seconds(lambda _: put(r), 1))
                gets.append(seconds(lambda _: get(r), 1))
            first = puts[0] + gets[0]
            s, g = statistics.median(puts[WARM:]), statistics.median(gets[WARM:])
            assert np.array_equal(dst.kv_buffer[:, :n], src.kv_buffer[:, :n])
            who = "caller alone" if threads == 0 else f"caller + {threads} helpers"
            print(f"batch_set_v1 ({who:20}) {s * 1e3:8.1f} ms  {batch_bytes / s / 1e9:6.2f} GB/s  {base / s:4.2f}")
            print(f"batch_get_v1 ({who:20}) {g * 1e3:8.1f} ms  {batch_bytes / g / 1e9:6.2f} GB/s  {base / g:4.2f}"
                  "  (with its batch_exists)")
            print(f"  the first set and get of this process, before its arena mapping was warm: {first * 1e3:.0f} ms")
            writer.close()
            reader.close()
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
