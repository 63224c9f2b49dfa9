"""kvstrand.vllm's telemetry, in vLLM's KVConnectorStats shape: counters each
side keeps for one logging interval. vLLM sums the workers' (aggregate),
adds the scheduler's, and logs reduce()'s figures.

Prometheus (vLLM's build_prom_metrics hook): one counter per figure,
vllm:kvstrand_<counter>, labelled per engine as vLLM labels its own.

Counters:
  lookup_tokens     prompt tokens past the local hit the tier was asked about
  hit_tokens        of those, tokens the tier held and vLLM was told to load
  loads, loads_failed, loaded_tokens
  saves, saves_failed, saved_tokens
"""

from dataclasses import dataclass

from .interface import KVConnectorPromMetrics, KVConnectorStats

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


class KvstrandPromMetrics(KVConnectorPromMetrics):
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.counters = {
            name: self.make_per_engine(self._counter_cls(
                name=f"vllm:kvstrand_{name}", documentation=f"kvstrand.vllm: {name.replace('_', ' ')}",
                labelnames=labelnames))
            for name in COUNTERS}

    def observe(self, transfer_stats_data, engine_idx=0):
        for name, counters in self.counters.items():
            value = int((transfer_stats_data or {}).get(name, 0))
            if value:
                counters[engine_idx].inc(value)
