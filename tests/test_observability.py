"""Metrics a vLLM dashboard can read (issue 15): every series carries model_name, the standard
vLLM series exist under their vLLM names, counters replace since-start ratio gauges, and the
shipped Grafana dashboard and Prometheus alerts use only metric names the server exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.fake_engine import fake_built, words
from tests.server_utils import running_server

ROOT = Path(__file__).resolve().parent.parent
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "rate", "irate", "increase", "histogram_quantile",
    "by", "without", "and", "or", "unless", "on", "ignoring", "le", "offset", "bool",
    "label_values", "topk", "bottomk", "clamp_min", "clamp_max", "abs", "time",
}  # fmt: skip
# What vLLM's own example dashboard and common alerts query.
VLLM_SERIES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:request_success_total",
    "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket",
    "vllm:iteration_tokens_total_bucket",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:request_time_per_output_token_seconds_bucket",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_queue_time_seconds_bucket",
    "vllm:request_prefill_time_seconds_bucket",
    "vllm:request_decode_time_seconds_bucket",
    "vllm:request_inference_time_seconds_bucket",
    "process_resident_memory_bytes",
    "python_gc_objects_collected_total",
)


def _scrape() -> list:
    built = fake_built(num_blocks=64, block_size=4)
    with running_server(built) as (url, _):
        for i in range(3):
            body = {"prompt": words(9, i), "max_tokens": 6, "ignore_eos": True}
            assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 200
        httpx.post(f"{url}/v1/completions", json={**body, "prompt": words(9, 0)}, timeout=30)
        text = httpx.get(f"{url}/metrics", timeout=10).text
    return list(text_string_to_metric_families(text))


_FAMILIES = None


def families():
    global _FAMILIES
    if _FAMILIES is None:
        _FAMILIES = _scrape()
    return _FAMILIES


SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count")}


def sample_names() -> set[str]:
    """Every series name the server can export, observed yet or not (a labelled counter shows
    no sample before its first increment)."""
    names = {s.name for f in families() for s in f.samples}
    for f in families():
        names.update(f.name + suffix for suffix in SUFFIXES.get(f.type, ("",)))
    return names


def test_every_server_series_carries_model_name_and_the_vllm_series_exist():
    names = sample_names()
    for name in VLLM_SERIES:
        assert name in names, name
    for fam in families():
        if fam.name.startswith(("llm_", "vllm:")):
            for s in fam.samples:
                assert s.labels.get("model_name") == "SmolLM2-135M-Instruct", s
        if fam.name.startswith("vllm:"):
            assert all(s.labels.get("engine") == "0" for s in fam.samples), fam.name
    by_name = {f.name: f for f in families()}
    # No ratio since start: counters that rate() can window, and the seed's two gauges over a
    # sliding window (tests/test_metrics_hardening.py).
    assert by_name["llm_sla_attainment"].type == "gauge"
    assert by_name["llm_kv_cache_hit_rate"].type == "gauge"
    assert by_name["llm_sla_met"].type == "counter" and by_name["llm_sla_requests"].type == (
        "counter"
    )
    hits = sum(s.value for s in by_name["vllm:prefix_cache_hits"].samples if s.name.endswith("l"))
    assert hits > 0  # the repeated prompt hit the prefix cache
    itl = [
        s for s in by_name["vllm:inter_token_latency_seconds"].samples if s.name.endswith("count")
    ]
    assert itl[0].value == 4 * 5  # 4 requests x (6 tokens - the first)
    tenants = by_name["llm_tenant_generation_tokens"].samples
    assert any(s.labels.get("tenant") == "default" and s.value == 24 for s in tenants)


def _metric_names(expr: str) -> set[str]:
    expr = re.sub(r"label_values\(([^,]+),[^)]*\)", r"\1", expr)  # (metric, label name)
    expr = re.sub(r'"[^"]*"', "", expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping labels
    tokens = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", expr))
    return {t for t in tokens if t not in PROMQL_WORDS and not t.startswith("$")}


def test_dashboard_and_alerts_use_only_metric_names_the_server_exports():
    exported = sample_names()
    dash = json.loads((ROOT / "deploy/grafana/tierserve.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    rules = yaml.safe_load((ROOT / "deploy/prometheus/alerts.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    assert len(exprs) >= 15
    used = set().union(*(_metric_names(e) for e in exprs))
    assert used, "the expression parser found no metric names"
    unknown = sorted(used - exported)
    assert unknown == [], unknown
    titles = " ".join(p["title"] for p in dash["panels"])
    for needed in ("TTFT P95", "Queue depth", "Preemptions", "KV partitions", "SLA attainment"):
        assert needed in titles, needed
    assert any("P0" in r["expr"] and "llm_sla_met" in r["expr"] for g in rules["groups"]
               for r in g["rules"])  # fmt: skip


def test_the_name_checker_catches_an_unknown_metric():
    assert _metric_names('sum by (priority) (rate(llm_nope_total{a="b"}[5m]))') == {
        "llm_nope_total"
    }
