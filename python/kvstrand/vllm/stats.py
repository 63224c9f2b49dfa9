"""kvstrand.vllm's telemetry, in vLLM's KVConnectorStats shape: counters each
side keeps for one logging interval. vLLM sums the workers' (aggregate),
adds the scheduler's, and logs reduce()'s figures.

Prometheus (vLLM's build_prom_metrics hook): one counter per figure,
vllm:kvstrand_<counter>, labelled per engine as vLLM labels its own. The
metrics are optional: where this vLLM's Prometheus API differs from what
kvstrand knows, they are off (logged once) and vLLM runs on.

Counters:
  lookup_tokens     prompt tokens past the local hit the tier was asked about
  hit_tokens        of those, tokens the tier held and vLLM was told to load
  loads, loads_failed, loaded_tokens
  saves, saves_failed, saved_tokens
"""

import logging
from dataclasses import dataclass

from .interface import KVConnectorPromMetrics, KVConnectorStats

log = logging.getLogger("kvstrand.vllm")

COUNTERS = ("lookup_tokens", "hit_tokens", "loads", "loads_failed", "loaded_tokens",
            "saves", "saves_failed", "saved_tokens")


@dataclass
class KvstrandStats(KVConnectorStats):
    def __post_init__(self):
        for name in COUNTERS:
            self.data.setdefault(name, 0)

    def reset(self):
        for name in COUNTERS:
            self.data[name] = 0

    def aggregate(self, other):
        for name in COUNTERS:
            self.data[name] += int((other.data or {}).get(name, 0))
        return self

    def reduce(self):
        out = dict(self.data)
        out["hit_rate"] = round(self.data["hit_tokens"] / self.data["lookup_tokens"], 4) \
            if self.data["lookup_tokens"] else 0.0
        return out

    def is_empty(self):
        return not any(self.data[name] for name in COUNTERS)

    def to_dict(self):
        """What vLLM's scheduler ships to the logger (newer vLLM); the
        logger rebuilds the stats from it (build_kv_connector_stats)."""
        return dict(self.data)

    # ---- what each side counts ----
    def lookup(self, asked_tokens, hit_tokens):
        self.data["lookup_tokens"] += asked_tokens
        self.data["hit_tokens"] += hit_tokens

    def load_ended(self, tokens, ok):
        self.data["loads"] += 1
        self.data["loads_failed"] += not ok
        self.data["loaded_tokens"] += tokens if ok else 0

    def save_ended(self, tokens, ok):
        self.data["saves"] += 1
        self.data["saves_failed"] += not ok
        self.data["saved_tokens"] += tokens if ok else 0

    def take(self):
        """This interval's counters (None if nothing happened); a new interval starts."""
        if self.is_empty():
            return None
        out = KvstrandStats(dict(self.data))
        self.reset()
        return out


def per_engine(metric, per_engine_labelvalues):
    """One labelled child of `metric` per engine index, as vLLM labels its
    own (v0.18's make_per_engine, later vllm.v1.metrics.utils)."""
    return {idx: metric.labels(*values) for idx, values in per_engine_labelvalues.items()}


class KvstrandPromMetrics(KVConnectorPromMetrics):
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters = {
            name: per_engine(self._counter_cls(
                name=f"vllm:kvstrand_{name}", documentation=f"kvstrand.vllm: {name.replace('_', ' ')}",
                labelnames=labelnames), per_engine_labelvalues)
            for name in COUNTERS}

    def observe(self, transfer_stats_data, engine_idx=0):
        for name, counters in self.counters.items():
            value = int((transfer_stats_data or {}).get(name, 0))
            if value:
                counters[engine_idx].inc(value)


class NoPromMetrics:
    """Prometheus off: observes nothing."""

    def observe(self, transfer_stats_data, engine_idx=0):
        return


def build_prom_metrics(vllm_config, metric_types, labelnames, per_engine_labelvalues):
    """kvstrand's Prometheus metrics, or none (logged once) where this vLLM's
    metrics API is not one kvstrand knows: an exception here would stop
    vLLM's API server at start-up."""
    try:
        return KvstrandPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
    except Exception as e:  # noqa: BLE001 - optional telemetry never stops the engine
        log.warning("kvstrand.vllm: Prometheus metrics off: this vLLM's connector metrics API differs from the one "
                    "kvstrand knows (%s: %s); serving goes on without them", type(e).__name__, e)
        return NoPromMetrics()
