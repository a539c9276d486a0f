"""Prometheus metrics: tierserve's own ``llm_*`` series with priority labels, and the series a
vLLM dashboard reads under their ``vllm:`` names. Every series carries ``model_name``."""

from tierserve.metrics.recorder import Metrics

__all__ = ["Metrics"]
