"""benchmarks/served/predictive_serve.py's reading of /metrics (the predictor's error per class
over a
run, preemptions), and the predictor state file a benchmark gives each server."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from tests.helpers import make_request
from tierserve.core.predict import LengthPredictor, default_path, load_state, save_state

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "predictive_serve", ROOT / "benchmarks" / "served" / "predictive_serve.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def metrics(p1: list[float], p2_count: float, preempted: float) -> str:
    """A /metrics page: P1's error histogram with cumulative counts `p1` over 1, 2, 5, 10, +Inf."""
    name = "llm_output_length_prediction_error_tokens"
    lines = ["# HELP x", "# TYPE x histogram"]
    for le, n in zip(("1.0", "2.0", "5.0", "10.0", "+Inf"), p1, strict=True):
        lines.append(f'{name}_bucket{{le="{le}",model_name="m",priority="P1"}} {n}')
    lines.append(f'{name}_bucket{{le="+Inf",model_name="m",priority="P2"}} {p2_count}')
    lines.append(
        f'llm_preemption_total{{model_name="m",reason="swap",victim_priority="P2"}} {preempted}'
    )
    return "\n".join(lines)


def parse(bench, text: str) -> dict:
    out = {}
    for line in text.splitlines():
        m = bench._SAMPLE.match(line)
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def test_error_quantiles_are_the_difference_across_the_run(bench):
    before = parse(bench, metrics([1, 1, 1, 1, 1], 3, 2))
    after = parse(
        bench, metrics([1, 3, 9, 11, 11], 3, 7)
    )  # the run: 2 in (1,2], 6 in (2,5], 2 in (5,10]
    err = bench.error_by_class(before, after)
    assert err["P1"]["n"] == 10 and err["P2"]["n"] == 0
    assert err["P1"]["p50"] == pytest.approx(2 + 3 * (5 - 2) / 6)  # rank 5 of 10, inside (2, 5]
    assert err["P1"]["p90"] == pytest.approx(5 + 5 * (9 - 8) / 2)  # rank 9, inside (5, 10]
    assert err["P2"]["p50"] is None
    assert bench.counter_diff(before, after, "llm_preemption_total") == 5


def test_histogram_quantile_edges(bench):
    assert bench.hist_quantile([], 0.5) is None
    assert bench.hist_quantile([(1.0, 0), (float("inf"), 4)], 0.5) == 1.0  # beyond the last bound
    assert bench.hist_quantile([(1.0, 4), (float("inf"), 4)], 0.9) == pytest.approx(0.9)


def test_tenants_file_gives_every_tenant_a_key(bench, tmp_path):
    from tierserve.api.tenancy import TenantRegistry

    f = tmp_path / "t.yaml"
    f.write_text(bench.tenants_yaml())
    reg = TenantRegistry.from_yaml(f)
    for t in bench.TENANTS:
        assert reg.authenticate(f"Bearer {bench.key_of(t)}", None).name == t


def test_the_state_file_can_be_named(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERSERVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TIERSERVE_PREDICTOR_STATE", str(tmp_path / "mine.json"))
    assert default_path() == tmp_path / "mine.json"
    p = LengthPredictor()
    for _ in range(10):
        r = make_request(8, tenant="t", max_tokens=64)
        p.observe(r, 20, 0.0, p.predict(r, 0.0))
    save_state(p)
    assert (tmp_path / "mine.json").exists() and not (tmp_path / "cache").exists()
    q = LengthPredictor()
    load_state(q)
    assert q.predict(make_request(8, tenant="t", max_tokens=64), 0.0).level != "none"
