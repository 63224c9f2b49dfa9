"""vLLM v0.18's connector telemetry: stats shipped from the workers to the
logger as a dict, and a Prometheus base whose make_per_engine labels one
child per engine."""

from dataclasses import dataclass, field

from prometheus_client import Counter, Gauge, Histogram


@dataclass
class KVConnectorStats:
    data: dict = field(default_factory=dict)

    def reset(self):
        raise NotImplementedError

    def aggregate(self, other):
        raise NotImplementedError

    def reduce(self):
        raise NotImplementedError

    def is_empty(self):
        raise NotImplementedError


class KVConnectorPromMetrics:
    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        self._kv_transfer_config = vllm_config.kv_transfer_config
        self._gauge_cls = metric_types[Gauge]
        self._counter_cls = metric_types[Counter]
        self._histogram_cls = metric_types[Histogram]
        self._labelnames = labelnames
        self.per_engine_labelvalues = per_engine_labelvalues

    def make_per_engine(self, metric):
        return {idx: metric.labels(*values) for idx, values in self.per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data, engine_idx=0):
        raise NotImplementedError


class KVConnectorPrometheus:
    """What vLLM's PrometheusStatLogger makes at start-up: the connector's
    metrics, through its build_prom_metrics."""

    def __init__(self, connector_cls, vllm_config, labelnames, per_engine_labelvalues, metric_types=None):
        types = metric_types or {Gauge: Gauge, Counter: Counter, Histogram: Histogram}
        self.prom_metrics = connector_cls.build_prom_metrics(vllm_config, types, labelnames, per_engine_labelvalues)

    def observe(self, transfer_stats_data, engine_idx=0):
        if self.prom_metrics is not None:
            self.prom_metrics.observe(transfer_stats_data, engine_idx)
