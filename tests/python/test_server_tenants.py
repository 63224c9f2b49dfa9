"""Tenants on one kvstrand-server (--tenant-quota): a tenant that floods
the arena evicts its own objects once past its quota, and the other keeps
its reserve and its hit rate; neither finds the other's chunks, even for the
same tokens; /metrics and /debug/tier show each tenant's bytes. The test
prints the figures, against the same run without quotas."""

import time

from conftest import BLOCK_BYTES, BLOCKS, Server, make_layout
import kvstrand

PROMPT = 128  # tokens: 2 chunks of 64, 8 blocks of 16; an object is 4 blocks (16 KiB)


class TenantEngine:
    def __init__(self, server, tenant):
        self.layout = make_layout(tenant=tenant)
        self.memory = kvstrand.sim.allocate(BLOCKS * BLOCK_BYTES)
        self.conn = kvstrand.Connector(server_socket=server.socket, server_request_timeout=5.0,
                                       transfer_deadline=20.0)
        self.group = self.conn.register_layout(
            kvstrand.Registration(self.layout, [kvstrand.PlaneMemory(self.memory.address, BLOCKS)]))

    def keys(self, prompt):
        return kvstrand.chunk_keys(self.layout, [prompt * 1000 + t for t in range(PROMPT)])

    def wait(self, what):
        end = time.monotonic() + 20
        while time.monotonic() < end:
            f = self.conn.finished()
            got = getattr(f, what)
            if got:
                return got[0]
            time.sleep(0.001)
        raise AssertionError(f"no {what} in 20 s")

    def save(self, prompt):
        spec = kvstrand.TransferSpec(request=f"p{prompt}", registration=self.group,
                                     tokens=kvstrand.TokenRange(0, PROMPT), keys=self.keys(prompt),
                                     blocks=list(range(PROMPT // 16)))
        self.conn.save(spec)
        return self.wait("saves").ok

    def hits(self, prompt):
        """Chunks of the prompt the tier holds (the lease given back)."""
        self.conn.lookup(self.keys(prompt), self.group)
        answer = self.wait("lookups")
        if answer.lease:
            self.conn.release_lookup(answer.lease)
        return answer.hit.tokens // 64

    def close(self):
        self.conn.close()


def run(quotas):
    """Tenant b stores 40 prompts (1.25 MiB), tenant a then stores 200 (6.25
    MiB) into a 4 MiB arena, then b 24 more (to 2 MiB, its quota); b's hit
    rate on all its prompts after, and each tenant's bytes."""
    flags = [f for name in quotas for f in ("--tenant-quota", f"{name}=2M")]
    server = Server(tier="4M", slab="2M", extra=flags)
    a, b = TenantEngine(server, "a"), TenantEngine(server, "b")
    try:
        for p in range(40):
            assert b.save(p)
        for p in range(1000, 1200):
            assert a.save(p)
        # a borrowed the free space past its quota; b takes its share back.
        for p in range(40, 64):
            assert b.save(p)
        hit = sum(b.hits(p) for p in range(64)) / (64 * PROMPT // 64)
        tier = server.tier()
        by_name = {t["tenant"]: t for t in tier["tenants"]}
        # The same tokens under the other tenant: never the other's chunks.
        crossed = sum(a.hits(p) for p in range(40)) + sum(b.hits(p) for p in range(1190, 1200))
        return hit, by_name, crossed, server.metric('tenant_bytes{tenant="a",level="arena"}')
    finally:
        a.close()
        b.close()
        server.stop()


def test_a_tenant_flooding_its_quota_leaves_the_others_reserve_and_hit_rate():
    hit, tenants, crossed, a_metric = run(["a", "b"])
    free_hit, free_tenants, free_crossed, _ = run([])
    print(f"\ntenant b's hit rate after tenant a stored 6.25 MiB into a 4 MiB arena and b grew to its quota: "
          f"{hit:.2f} with --tenant-quota "
          f"a=2M b=2M, {free_hit:.2f} without; tenant a's bytes: {tenants['a']['bytes'] / 2**20:.2f} MiB (quota 2), "
          f"{free_tenants['a']['bytes'] / 2**20:.2f} MiB without; a's evictions {tenants['a']['evictions']}, "
          f"b's {tenants['b']['evictions']}")
    assert hit == 1.0  # every chunk of b's is still there
    assert tenants["b"]["evictions"] == 0 and tenants["b"]["bytes"] == 64 * 2 * 16384
    assert tenants["a"]["bytes"] <= 2 << 20 and tenants["a"]["quota_bytes"] == 2 << 20
    assert a_metric == tenants["a"]["bytes"]
    assert crossed == 0 and free_crossed == 0
    # Without quotas the flood took b's objects: what the quotas are for.
    assert free_hit < 0.5 and free_tenants["b"]["evictions"] > 0


def disk_run(quotas, disk_dir):
    """The same flood over a 4 MiB arena and an 8 MiB disk: b's objects on
    the disk, and b's hit rate from the disk alone after a restart."""
    flags = [f for name in quotas for f in ("--tenant-quota", f"{name}=2M")]
    flags += ["--disk", str(disk_dir), "--disk-bytes", "8M"]
    server = Server(tier="4M", slab="2M", extra=flags)
    a, b = TenantEngine(server, "a"), TenantEngine(server, "b")
    try:
        for p in range(40):
            assert b.save(p)
            # On the disk before the next: the write queue (an eighth of the
            # arena, 32 objects here) drops what a busy host has not written.
            written(server)
        assert server.metric("disk_write_dropped_total") == 0  # every chunk of b's is on the disk
        for p in range(1000, 1400):
            assert a.save(p)
            if p % 50 == 0:
                written(server)  # the flood reaches the disk, not only the write queue's drops
        written(server)
        disk_b = server.metric('tenant_bytes{tenant="b",level="disk"}')
        evicted_b = server.metric('tenant_evictions_total{tenant="b",level="disk"}')
        disk_a = server.metric('tenant_bytes{tenant="a",level="disk"}')
        quota_a = server.metric('tenant_quota_bytes{tenant="a",level="disk"}')
    finally:
        a.close()
        b.close()
        server.kill()
    again = Server(tier="4M", slab="2M", socket=server.socket, extra=flags)
    # Each disk object's tenant is in its header: b's bytes are b's at once.
    restarted_b = again.metric('tenant_bytes{tenant="b",level="disk"}')
    b = TenantEngine(again, "b")
    try:
        hit = sum(b.hits(p) for p in range(40)) / 80
    finally:
        b.close()
        again.stop()
        server.stop()
    return hit, disk_b, evicted_b, disk_a, quota_a, restarted_b


def written(server):
    end = time.monotonic() + 30
    while server.metric("disk_write_queue") != 0 or server.metric("disk_in_flight") != 0:
        assert time.monotonic() < end, "the disk did not drain in 30 s"
        time.sleep(0.01)


def test_on_the_disk_too_a_flooding_tenant_evicts_its_own_objects(tmp_path):
    hit, disk_b, evicted_b, disk_a, quota_a, restarted_b = disk_run(["a", "b"], tmp_path / "q")
    free_hit, _, free_evicted_b, _, _, _ = disk_run([], tmp_path / "free")
    print(f"\ntenant b's hit rate from the disk after a restart, once tenant a stored 12.5 MiB over an 8 MiB disk: "
          f"{hit:.2f} with --tenant-quota a=2M b=2M, {free_hit:.2f} without; a's disk bytes "
          f"{disk_a / 2**20:.2f} MiB (its share {quota_a / 2**20:.2f})")
    assert hit == 1.0 and disk_b == 80 * 16384 and evicted_b == 0
    assert restarted_b == disk_b
    assert quota_a is not None and disk_a <= 8 << 20
    assert free_evicted_b > 0 and free_hit < 1.0


def test_chunks_the_disk_promotes_are_their_tenants_and_the_default_quota_is_the_disks_share(tmp_path):
    # A 4 MiB arena over an 8 MiB disk (less its headers: about 1.5 times the arena).
    server = Server(tier="4M", slab="2M", extra=["--disk", str(tmp_path / "a"), "--disk-bytes", "8M"])
    a, b = TenantEngine(server, "a"), TenantEngine(server, "b")
    try:
        for p in range(8):
            assert b.save(p)
            written(server)
        assert server.metric("disk_write_dropped_total") == 0  # b's 16 chunks are on the disk
        for p in range(1000, 1140):  # 280 objects through the arena's 256: b's all go
            assert a.save(p)
        assert sum(b.hits(p) for p in range(8)) == 16  # from the disk, promoted for b's lookups
        assert server.metric("disk_promoted_total") >= 16
        tenants = {t["tenant"]: t for t in server.tier()["tenants"]}
        assert tenants["b"]["bytes"] == 16 * 16384  # b's, not nobody's (b's quota counts them)
    finally:
        a.close()
        b.close()
        server.stop()
    server = Server(tier="4M", slab="2M", extra=["--tenant-quota-default", "1M", "--disk", str(tmp_path / "b"),
                                                 "--disk-bytes", "8M"])
    b = TenantEngine(server, "b")
    try:
        assert b.save(0)
        # The default quota on the disk: the arena's scaled to the disk's capacity, not the arena's 1 MiB.
        share = (1 << 20) * server.metric("disk_capacity_bytes") / (4 << 20)
        assert abs(server.metric('tenant_quota_bytes{tenant="b",level="disk"}') - share) <= 1 and share > 1 << 20
        assert server.metric('tenant_quota_bytes{tenant="b",level="arena"}') == 1 << 20
    finally:
        b.close()
        server.stop()


def test_an_operator_drops_a_tenants_objects_from_a_shell():
    import subprocess
    from conftest import server_binary
    server = Server(tier="4M", slab="2M", extra=["--tenant-quota", "a=2M"])
    a, b = TenantEngine(server, "a"), TenantEngine(server, "b")
    try:
        for p in range(10):
            assert a.save(p) and b.save(p)
        r = subprocess.run([server_binary(), "--socket", server.socket, "--drop-tenant", "a"], capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert "dropped tenant a's namespaces: 20 objects in the arena" in r.stdout
        tenants = {t["tenant"]: t for t in server.tier()["tenants"]}
        assert tenants["a"]["bytes"] == 0 and tenants["b"]["bytes"] == 20 * 16384
        assert sum(a.hits(p) for p in range(10)) == 0 and sum(b.hits(p) for p in range(10)) == 20
        bad = subprocess.run([server_binary(), "--socket", server.socket, "--drop-tenant", "a b"],
                             capture_output=True, text=True, timeout=30)
        assert bad.returncode == 2 and "invalid --drop-tenant" in bad.stderr
    finally:
        a.close()
        b.close()
        server.stop()


def test_a_restart_on_the_named_arena_keeps_each_objects_tenant(tmp_path):
    """Objects a restarted server found again belonged to no tenant until
    stored anew: a flood right after a SIGKILL and restart evicted all of
    tenant b's, its quota notwithstanding. Each object's tenant is kept with
    it now (by tag), named or configured or not."""
    import os
    arena = f"/dev/shm/kvstrand-py-tenants-{os.getpid()}"
    flags = ["--arena-path", arena, "--tenant-quota", "a=2M", "--tenant-quota", "b=2M"]
    server = Server(tier="4M", slab="2M", extra=flags)
    b, c = TenantEngine(server, "b"), TenantEngine(server, "c")
    try:
        for p in range(40):
            assert b.save(p)
        for p in range(5):
            assert c.save(p)
        b.close()
        c.close()
        server.kill()
        server = Server(tier="4M", slab="2M", socket=server.socket, extra=flags)
        tenants = {t["tenant"]: t for t in server.tier()["tenants"]}
        assert tenants["b"]["bytes"] == 40 * 2 * 16384  # b's at once, before b has said a word
        # c, named by no flag, is known by its tag until it registers.
        kept = [t for name, t in tenants.items() if name.startswith("#")]
        assert len(kept) == 1 and kept[0]["bytes"] == 5 * 2 * 16384
        a = TenantEngine(server, "a")
        for p in range(1000, 1200):  # 6.25 MiB into the 4 MiB arena, right after the restart
            assert a.save(p)
        b = TenantEngine(server, "b")
        hit = sum(b.hits(p) for p in range(40)) / 80
        tenants = {t["tenant"]: t for t in server.tier()["tenants"]}
        print(f"\ntenant b's hit rate after a restart and tenant a's flood: {hit:.2f} "
              f"(b's evictions {tenants['b']['evictions']})")
        assert hit == 1.0 and tenants["b"]["evictions"] == 0
        c = TenantEngine(server, "c")
        tenants = {t["tenant"]: t for t in server.tier()["tenants"]}
        assert "c" in tenants and not any(name.startswith("#") for name in tenants)  # its own name once it says it
        a.close()
    finally:
        b.close()
        c.close()
        server.stop()
        for path in (arena, arena + ".lock"):
            if os.path.exists(path):
                os.unlink(path)
