"""vLLM's connector telemetry at 00f4240. The Prometheus base no longer has
make_per_engine: connectors label their metrics per engine with
vllm.v1.metrics.utils.create_metric_per_engine. The scheduler ships stats
to the logger through to_dict()."""

from dataclasses import asdict, dataclass, field

from prometheus_client import Counter, Gauge, Histogram


@dataclass
class KVConnectorStats:
    data: dict = field(default_factory=dict)

    def to_dict(self):
        return asdict(self)["data"]

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

    def observe(self, transfer_stats_data, engine_idx=0):
        raise NotImplementedError


class KVConnectorProm:
    """What vLLM's PrometheusStatLogger makes at start-up: the connector's
    metrics, through its build_prom_metrics (an exception here stops the
    API server)."""

    def __init__(self, connector_cls, vllm_config, labelnames, per_engine_labelvalues, metric_types=None):
        types = metric_types or {Gauge: Gauge, Counter: Counter, Histogram: Histogram}
        self.prom_metrics = connector_cls.build_prom_metrics(vllm_config, types, labelnames, per_engine_labelvalues)

    def observe(self, transfer_stats_data, engine_idx=0):
        if self.prom_metrics is None:
            return
        self.prom_metrics.observe(transfer_stats_data, engine_idx)
