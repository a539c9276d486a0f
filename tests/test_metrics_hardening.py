"""/metrics keeps the seed's six series beside the counters, with windowed ratio gauges, and
no client can grow the series (issue 23, items 1 and 5)."""

from __future__ import annotations

from dataclasses import replace

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.fake_engine import fake_built, words
from tests.server_utils import running_server
from tierserve.api.settings import ServerSettings
from tierserve.config import PriorityConfig
from tierserve.engine.snapshot import take_snapshot
from tierserve.metrics import Metrics
from tierserve.priority import Priority
from tierserve.request import FinishReason, Request

# The six series the seed names, with their labels (model_name is added to every series).
SEED_SERIES = {
    "llm_scheduler_queue_depth": {"priority"},
    "llm_scheduler_wait_seconds": {"priority"},
    "llm_kv_cache_hit_rate": {"priority"},
    "llm_preemption": {"victim_priority", "reason"},
    "llm_sla_attainment": {"priority", "tier"},
    "llm_kv_swap_seconds": {"direction"},
}


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(fams: dict, name: str, **labels) -> float:
    """The one sample named `name` (a counter's `_total` included) with these labels."""
    found = [
        s
        for f in fams.values()
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    (s,) = found
    return s.value


def test_window_ratio_counts_only_the_last_window():
    from tierserve.metrics.window import WindowRatio

    w = WindowRatio(60.0, empty=1.0)
    assert w.value(0.0) == 1.0  # nothing yet
    w.add(0.0, 0, 1)
    w.add(30.0, 1, 1)
    assert w.value(30.0) == 0.5
    assert w.value(60.5) == 1.0  # the miss at t=0 left the window; the hit at 30 stays
    assert w.value(91.0) == 1.0  # all gone: the empty value
    w.add(100.0, 3, 4)
    assert w.value(100.0) == 0.75


def _ended(rid: str, priority: Priority, ttft: float, at: float) -> Request:
    r = Request(rid, [1, 2, 3], priority=priority, arrival_time=at - ttft - 1.0)
    r.first_token_time = r.arrival_time + ttft
    r.finished_time = at
    r.finish_reason = FinishReason.STOP
    return r


def test_sla_attainment_gauge_is_windowed_and_follows_snapshots():
    built = fake_built()
    m = Metrics(PriorityConfig(ttft_sla_s=(0.5, 5.0, 60.0, None)), "m", window_s=60.0)
    fams = _families(m.render().decode())
    assert _value(fams, "llm_sla_attainment", priority="P1", tier="online") == 1.0
    m.on_finished(_ended("a", Priority.P1, ttft=9.0, at=100.0))  # missed 5 s
    m.on_finished(_ended("b", Priority.P1, ttft=1.0, at=110.0))  # met
    m.on_finished(_ended("c", Priority.P0, ttft=0.1, at=110.0))  # met
    fams = _families(m.render().decode())
    assert _value(fams, "llm_sla_attainment", priority="P1", tier="online") == 0.5
    assert _value(fams, "llm_sla_attainment", priority="P0", tier="realtime") == 1.0
    # The counters keep everything; a snapshot 61 s after the miss drops it from the gauge.
    assert _value(fams, "llm_sla_requests_total", priority="P1", tier="online") == 2
    snap = replace(take_snapshot(built.engine, 1), taken_at=161.0)
    m.on_snapshot(snap)
    fams = _families(m.render().decode())
    assert _value(fams, "llm_sla_attainment", priority="P1", tier="online") == 1.0


def test_the_seed_series_are_exported_with_their_labels_beside_the_counters():
    built = fake_built(num_blocks=64, block_size=4)
    with running_server(built) as (url, _):
        body = {"prompt": words(16, 0), "max_tokens": 4, "ignore_eos": True}
        for _ in range(3):  # the same prompt: later ones hit the prefix cache
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=30)
            assert r.status_code == 200
        fams = _families(httpx.get(f"{url}/metrics", timeout=10).text)
    for name, labels in SEED_SERIES.items():
        assert name in fams, name
        for s in fams[name].samples:
            assert labels <= set(s.labels), (name, s.labels)
    assert fams["llm_kv_cache_hit_rate"].type == "gauge"
    assert fams["llm_sla_attainment"].type == "gauge"
    # P1 (the default class) looked up 3 x 16 tokens; the second and third found whole blocks.
    rate = _value(fams, "llm_kv_cache_hit_rate", priority="P1")
    hits = _value(fams, "llm_prefix_cache_hits_total", priority="P1")
    queries = _value(fams, "llm_prefix_cache_queries_total", priority="P1")
    assert 0 < rate <= 1 and rate == hits / queries
    assert _value(fams, "llm_sla_attainment", priority="P1", tier="online") == 1.0
    assert _value(fams, "llm_kv_cache_hit_rate", priority="P0") == 0.0  # no lookups


def _metrics_text(url: str) -> str:
    return httpx.get(f"{url}/metrics", timeout=10).text


def test_open_mode_tenant_ids_do_not_create_series():
    built = fake_built(num_blocks=64, block_size=4)
    with running_server(built) as (url, _):

        def send(tenant: str) -> None:
            body = {"prompt": words(4), "max_tokens": 1}
            h = {"x-tenant-id": tenant}
            r = httpx.post(f"{url}/v1/completions", json=body, headers=h, timeout=30)
            assert r.status_code == 200

        send("t-0")
        before = _metrics_text(url)
        for i in range(1, 60):
            send(f"t-{i}")
        after = _metrics_text(url)
    tenants = {
        s.labels["tenant"]
        for f in text_string_to_metric_families(after)
        if f.name.startswith("llm_tenant_")
        for s in f.samples
    }
    assert tenants == {"other"}
    assert len(after.splitlines()) == len(before.splitlines())  # no new series


def test_configured_tenants_keep_their_own_series(tmp_path):
    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n  acme: {keys: [sk-acme]}\n  beta: {keys: [sk-beta]}\n")
    built = fake_built(num_blocks=64, block_size=4)
    with running_server(built, ServerSettings(tenants_file=str(path))) as (url, _):
        for key in ("sk-acme", "sk-beta"):
            r = httpx.post(
                f"{url}/v1/completions",
                json={"prompt": words(4), "max_tokens": 1},
                headers={"authorization": f"Bearer {key}", "x-tenant-id": "spoof"},
                timeout=30,
            )
            assert r.status_code == 200
        fams = _families(_metrics_text(url))
    tenants = {s.labels["tenant"] for s in fams["llm_tenant_prompt_tokens"].samples}
    assert tenants == {"acme", "beta"}
