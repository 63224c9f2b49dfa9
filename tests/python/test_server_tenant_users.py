"""Tenants bound to the users their engines run as (--tenant-uid): each
engine here is a process of its own uid (forked, so the test runs as root).
The quotas hold as they do for self-named tenants, and again right after a
SIGKILL and restart on the named arena and on the disk; a tenant with a
segment of its own (--tenant-segment) is served from it; a published one's
(--public-tenant) pages are read by another tenant's SGLang."""

import os
import traceback

import pytest

from conftest import Server
from test_server_tenants import TenantEngine, written

ENGINES = 61000  # --socket-group: every tenant's process is in it
USERS = {"a": 61001, "b": 61002, "c": 61003}
BOUND = [f for name, uid in USERS.items() for f in ("--tenant-uid", f"{name}={uid}")] + \
    ["--socket-group", str(ENGINES)]

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="engines of other users need the test to run as root")


def forked(user, body):
    """body() in a forked child running as `user`'s uid: its return value
    (an int) is the exit code (90: it raised)."""
    pid = os.fork()
    if pid == 0:
        code = 90
        try:
            os.setgroups([ENGINES])
            os.setgid(ENGINES)
            os.setuid(USERS[user])
            code = int(body())
        except BaseException:
            traceback.print_exc()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def as_user(tenant, server, body):
    """body(engine) as tenant's user, with an engine of that tenant."""
    def run():
        engine = TenantEngine(server, tenant)
        try:
            return body(engine)
        finally:
            engine.close()
    return forked(tenant, run)


def start(flags, socket=None):
    server = Server(tier="4M", slab="2M", socket=socket, extra=BOUND + flags)
    os.chmod(server.dir, 0o755)  # the other users reach the socket (itself 0660, the engines' group's)
    return server


def hit_rate(engine, prompts):
    return sum(engine.hits(p) for p in prompts) / (2 * len(prompts))


@pytest.mark.parametrize("level", ["arena", "disk"])
def test_quotas_of_tenants_bound_to_users_hold_right_after_a_sigkill_and_restart(tmp_path, level):
    quotas = ["--tenant-quota", "a=2M", "--tenant-quota", "b=2M"]
    arena = f"/dev/shm/kvstrand-py-users-{os.getpid()}"
    where = ["--arena-path", arena] if level == "arena" else ["--disk", str(tmp_path / "d"), "--disk-bytes", "8M"]
    server = start(quotas + where)

    def store(b):
        # On the disk, 8 prompts (256 KiB) at a time: the write-behind queue
        # holds an eighth of the arena (512 KiB) and drops what comes past it
        # when the disk falls behind (a loaded machine: 16 of these 80 once).
        for p in range(40):
            if not b.save(p):
                return 1
            if level == "disk" and p % 8 == 7:
                written(server)
        return 0
    try:
        assert as_user("b", server, store) == 0
        if level == "disk":
            written(server)
            assert server.metric("disk_write_dropped_total") == 0
        server.kill()
        server = start(quotas + where, socket=server.socket)
        tenants = {t["tenant"]: t for t in server.tier()["tenants"]}
        kept = tenants["b"]["bytes"] if level == "arena" else server.metric('tenant_bytes{tenant="b",level="disk"}')
        assert kept == 40 * 2 * 16384  # b's at once, before b's engine has said a word

        def flood(a):
            for p in range(1000, 1400):  # 12.5 MiB through a 4 MiB arena
                if not a.save(p):
                    return 1
                if level == "disk" and p % 50 == 0:
                    written(server)
            return 0
        assert as_user("a", server, flood) == 0
        if level == "disk":
            written(server)
        # b's engine, as its own user: every chunk of its 40 prompts is still there.
        assert as_user("b", server, lambda b: 0 if hit_rate(b, range(40)) == 1.0 else 1) == 0
        # a, past its quota, took its own; and never reads b's chunks.
        assert as_user("a", server, lambda a: 0 if hit_rate(a, range(40)) == 0 else 1) == 0
    finally:
        server.stop()
        for path in (arena, arena + ".lock"):
            if os.path.exists(path):
                os.unlink(path)


def test_a_tenants_segment_serves_its_own_engine_and_no_other():
    server = start(["--tenant-segment", "a=4M"])
    try:
        # a's engine saves into its segment (an offset outside the memory it
        # was handed would be refused by its client) and finds its chunks.
        assert as_user("a", server, lambda a: 0 if all(a.save(p) for p in range(8)) and
                       hit_rate(a, range(8)) == 1.0 else 1) == 0
        # b's engine, in the shared arena, finds none of them for the same tokens.
        assert as_user("b", server, lambda b: 0 if hit_rate(b, range(8)) == 0 else 1) == 0
        assert server.metric("tier_segment_bytes") == 4 << 20
        tenants = {t["tenant"]: t for t in server.tier()["tenants"]}
        assert tenants["a"]["bytes"] == 8 * 2 * 16384
    finally:
        server.stop()


def test_a_published_tenants_pages_are_read_by_another_tenants_sglang_and_not_stored_again():
    import mini_sglang  # the picture of SGLang on sys.path
    server = Server(tier="4M", slab="2M", chunk_tokens=16,
                    extra=BOUND + ["--tenant-segment", "a=4M", "--public-tenant", "a"])
    os.chmod(server.dir, 0o755)
    system = list(range(10_000, 10_000 + 3 * 16))  # a system prompt of 3 pages, published by a

    def own(seed):
        return [seed * 100_000 + i for i in range(2 * 16)]

    def engine(tenant, body, **extra):
        def run():
            e = mini_sglang.MiniSGLang(server.socket, tenant=tenant, **extra)
            try:
                code = body(e)
                return code if code or e.mismatches == 0 else 9
            finally:
                e.close()
        return forked(tenant, run)

    try:
        assert engine("a", lambda e: 0 if e.serve(system + own(1)) == 0 else 1) == 0

        def reader(e):
            if e.serve(system + own(2)) != 3:
                return 1  # the published pages, read through memory handed read-only
            if e.serve(system + own(2)) != 5:
                return 2  # then its own, stored after them
            return 0 if e.backend().kvstrand_stats()["public_pages_read"] == 6 else 3
        assert engine("b", reader, public_tenant="a") == 0
        # Without public_tenant, c reads nothing of a's.
        assert engine("c", lambda e: 0 if e.serve(system + own(3)) == 0 else 1) == 0
        tenants = {t["tenant"]: t for t in server.tier()["tenants"]}
        page = tenants["a"]["bytes"] // 5
        assert tenants["b"]["bytes"] == 2 * page  # b's own two pages: the published three are not stored again
        assert tenants["c"]["bytes"] == 5 * page
    finally:
        server.stop()
