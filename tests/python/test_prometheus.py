"""The operator's dashboard and alerts, proven on a real Prometheus: Debian's
prometheus scrapes a real kvstrand-server (arena, disk, L2 on a real Redis,
KV events, a tenant with a quota) under a small workload, with
packaging/prometheus/kvstrand-rules.yml loaded; every query of
packaging/grafana/kvstrand.json and every recording rule returns data
through Prometheus's HTTP API, and every alert's expression evaluates."""

import json
import os
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
import yaml

import kvstrand
from conftest import Server
from kv_event_subscriber import free_port
from test_server_events import PROMPT_TOKENS, EventEngine

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
RULES = os.path.join(ROOT, "packaging", "prometheus", "kvstrand-rules.yml")
DASHBOARD = os.path.join(ROOT, "packaging", "grafana", "kvstrand.json")

pytestmark = pytest.mark.skipif(not (shutil.which("prometheus") and shutil.which("redis-server")),
                                reason="needs Debian's prometheus and redis-server (scripts/bootstrap.sh --test)")


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def query(port, expr):
    return get(f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))


def dashboard_queries():
    """Every target's expression, with the dashboard's variables as Grafana
    would fill them for this one server."""
    panels = json.load(open(DASHBOARD))["panels"]
    return [(p["title"], t["expr"].replace("$__rate_interval", "20s").replace('=~"$instance"', '=~".*"'))
            for p in panels for t in p["targets"]]


def test_the_dashboard_and_the_rules_return_data_from_a_real_prometheus(tmp_path):
    redis_port, prom_port, events_port = free_port(), free_port(), free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", str(tmp_path)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = Server(tier="4M", slab="2M", extra=["--disk", str(tmp_path / "disk"), "--disk-bytes", "16M",
                                                 "--l2", f"redis://127.0.0.1:{redis_port}",
                                                 "--events", f"tcp://127.0.0.1:{events_port}",
                                                 "--tenant-quota-default", "2M"])
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [os.path.abspath(RULES)],
        "scrape_configs": [{"job_name": "kvstrand", "static_configs": [{"targets": [server.http]}]}]}))
    prom = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    engine = None
    try:
        end = time.monotonic() + 60
        while True:
            try:
                if urllib.request.urlopen(f"http://127.0.0.1:{prom_port}/-/ready", timeout=2).status == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < end, "prometheus not ready in 60 s"
            time.sleep(0.2)
        # A small workload: described saves (events, the disk, L2), lookups
        # that hit and one that misses, for a few scrapes.
        engine = EventEngine(server, 0)
        for round_ in range(4):
            for p in range(6):
                engine.save(round_ * 10 + p)
            for p in list(range(round_ * 10, round_ * 10 + 6)) + [999]:
                tokens = [p * 1000 + t for t in range(PROMPT_TOKENS)]
                engine.conn.lookup(kvstrand.chunk_keys(engine.layout, tokens), engine.group)
                while not (f := engine.conn.finished()).lookups:
                    assert time.monotonic() < end + 60, "no lookup answer"
                    time.sleep(0.001)
                if f.lookups[0].lease:
                    engine.conn.release_lookup(f.lookups[0].lease)
            time.sleep(1.5)
        # Every query the dashboard draws returns data (a series at least).
        empty = []
        deadline = time.monotonic() + 30
        for title, expr in dashboard_queries():
            while True:
                r = query(prom_port, expr)
                assert r["status"] == "success", (title, expr, r)
                if r["data"]["result"]:
                    break
                if time.monotonic() > deadline:
                    empty.append((title, expr))
                    break
                time.sleep(0.5)
        assert not empty, f"dashboard queries with no data: {empty}"
        # Every recording rule has produced its series; every alert's expression evaluates.
        groups = yaml.safe_load(open(RULES))["groups"]
        for rule in (r for g in groups for r in g["rules"]):
            if "record" in rule:
                while not query(prom_port, rule["record"])["data"]["result"]:
                    assert time.monotonic() < deadline, f"recording rule {rule['record']} produced nothing"
                    time.sleep(0.5)
            else:
                assert query(prom_port, rule["expr"])["status"] == "success", rule["alert"]
        alerts = get(f"http://127.0.0.1:{prom_port}/api/v1/rules?type=alert")["data"]["groups"]
        assert sum(len(g["rules"]) for g in alerts) == 6
        assert all(r["health"] == "ok" for g in alerts for r in g["rules"]), alerts
    finally:
        if engine is not None:
            engine.close()
        prom.terminate()
        prom.wait()
        server.stop()
        redis.kill()
        redis.wait()
