"""vLLM's helper for per-engine metric children (00f4240)."""


def create_metric_per_engine(metric, per_engine_labelvalues):
    return {idx: metric.labels(*values) for idx, values in per_engine_labelvalues.items()}
