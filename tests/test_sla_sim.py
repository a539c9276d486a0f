"""SLA admission in the simulator: clients that retry after Retry-After (bounded), the opt-ins,
the per-class figures (attainment over admitted requests, refusals, goodput, predictor error)
and the `simulate` flags and report."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from dataclasses import replace

import pytest

from tierserve.admission.sla import retry_after_seconds
from tierserve.config import PriorityConfig
from tierserve.priority import Priority
from tierserve.sim.engine.driver import DriveResult, RequestRecord
from tierserve.sim.engine.runner import SimConfig, run_simulation
from tierserve.sim.engine.stats import run_stats
from tierserve.sim.scenarios import seed_table_sla_configs, with_sla_admission
from tierserve.workloads.synthetic import WorkloadConfig

P0, P1, P2, P3 = Priority

# One Llama-3.1-8B on an H100, far past saturation: 512 clients for a 128-seat engine.
OVERLOAD = SimConfig(
    hardware="h100-80gb",
    model="llama-3.1-8b",
    tp=1,
    max_num_seqs=128,
    max_num_batched_tokens=2048,
    workload=WorkloadConfig(concurrency=512, duration_s=60.0, warmup_s=15.0, seed=3),
)


@pytest.fixture(scope="module")
def overload_run():
    return run_simulation(with_sla_admission(OVERLOAD, True), keep_records=True)


def test_refused_clients_send_the_same_request_again_after_retry_after_at_most_max_retries(
    overload_run,
):
    recs = overload_run["records"]
    by_request = defaultdict(list)
    for r in recs:
        by_request[r.request_id.split("~")[0]].append(r)
    retried = [rs for rs in by_request.values() if len(rs) > 1]
    assert retried, "overload refused nobody"
    for rs in retried:
        rs.sort(key=lambda r: r.attempt)
        assert [r.attempt for r in rs] == list(range(len(rs)))
        assert len(rs) <= 1 + OVERLOAD.max_retries
        for prev, nxt in itertools.pairwise(rs):
            assert prev.outcome == "rejected"  # only a refusal is retried
            assert (nxt.priority, nxt.prompt_tokens, nxt.max_tokens) == (
                prev.priority,
                prev.prompt_tokens,
                prev.max_tokens,
            )
    # The retry comes exactly when its Retry-After said (whole seconds, as the header).
    stats = overload_run["classes"]
    assert overload_run["retries"] == sum(c["retries"] for c in stats.values()) > 0
    assert 0 < overload_run["retry_share"] < OVERLOAD.max_retries / (1 + OVERLOAD.max_retries)


def test_overload_keeps_the_admitted_on_time(overload_run):
    c = overload_run["classes"]
    assert c["P1"]["refused"] > 0 and c["P3"]["refused"] == 0  # P3 always queues
    assert c["P1"]["sla_attainment"] >= 0.9 and c["P2"]["sla_attainment"] >= 0.9
    assert c["P1"]["ttft_prediction_abs_error_p50_s"] is not None
    assert overload_run["goodput_requests_per_s"] == pytest.approx(
        sum(c[k]["goodput_requests_per_s"] for k in ("P0", "P1", "P2"))
    )
    assert overload_run["failed"] == 0 and overload_run["unfinished"] == 0


def test_opted_in_tenants_are_demoted_or_ended_early_in_the_simulator():
    cfg = replace(
        with_sla_admission(OVERLOAD, True),
        demote_tenants=("tenant-0",),
        end_early_tenants=("tenant-1",),
    )
    out = run_simulation(cfg, keep_records=True)
    recs = out["records"]
    demoted = [r for r in recs if r.demoted]
    assert demoted and all(r.priority in (P1, P2) for r in demoted)
    assert out["demoted"] > 0
    assert all(r.tenant == "tenant-0" for r in demoted)
    ended = [r for r in recs if r.outcome == "ended_early"]
    assert all(r.tenant == "tenant-1" for r in ended)
    assert out["ended_early"] == len([r for r in ended if 15.0 <= r.arrival < 60.0])
    # A P1/P2 request of the demoting tenant is never refused for its SLA: it runs as P3.
    assert not [
        r
        for r in recs
        if r.tenant == "tenant-0" and r.outcome == "rejected" and r.priority in (P1, P2)
    ]


def test_class_figures_count_admitted_requests_refusals_and_goodput():
    def rec(rid, prio, arrival, first, outcome="completed", attempt=0, predicted=None, **kw):
        r = RequestRecord(rid, prio, arrival, 100, 10, first_token=first, finish=first, **kw)
        r.outcome, r.attempt, r.predicted_ttft = outcome, attempt, predicted
        return r

    res = DriveResult(
        records=[
            rec("a", P1, 10.0, 12.0, predicted=1.5),  # on time (SLA 5 s), 0.5 s off
            rec("b", P1, 11.0, 18.0, predicted=5.0),  # late, 2 s off
            rec("c", P1, 12.0, None, "rejected"),
            rec("c~1", P1, 14.0, 15.0, attempt=1, predicted=1.0),  # the retry: on time
            rec("d", P1, 13.0, 40.0, demoted=True),  # ran as P3: not P1's
            rec("e", P1, 13.0, None, "ended_early"),  # admitted, then ended: a miss
            rec("f", P0, 10.0, 10.2),
            rec("g", P3, 10.0, 100.0),
            rec("h", P1, 5.0, 6.0),  # before the window
        ]
    )
    out = run_stats(res, 10.0, 30.0, PriorityConfig())
    p1 = out["classes"]["P1"]
    assert (p1["requests"], p1["refused"], p1["retries"], p1["demoted"], p1["ended_early"]) == (
        6,
        1,
        1,
        1,
        1,
    )
    assert p1["sla_attainment"] == pytest.approx(2 / 4)  # a, c~1 of a, b, c~1, e
    assert p1["sla_attainment_all"] == pytest.approx(2 / 6)
    assert p1["goodput_requests_per_s"] == pytest.approx(2 / 20)
    assert p1["ttft_prediction_abs_error_p50_s"] == pytest.approx(0.5)  # of 0.5, 0, 2
    assert p1["ttft_prediction_abs_error_p90_s"] == pytest.approx(2.0)
    assert out["goodput_requests_per_s"] == pytest.approx(3 / 20)  # P0-P2: a, c~1, f
    assert out["classes"]["P3"]["goodput_requests_per_s"] == pytest.approx(1 / 20)
    assert out["retry_share"] == pytest.approx(1 / 8)


def test_simulate_with_sla_admission_writes_the_goodput_report(tmp_path):
    from tierserve.cli import main

    out = tmp_path / "sim"
    rc = main(
        [
            "simulate",
            "--sla-admission",
            "on",
            "--sla-margin",
            "0.8",
            "--policy",
            "hybrid",
            "--concurrency",
            "64",
            "--hardware",
            "h100-80gb",
            "--model",
            "llama-3.1-8b",
            "--tp",
            "1",
            "--duration",
            "30",
            "--warmup",
            "5",
            "--workers",
            "1",
            "--out",
            str(out),
        ]
    )
    assert rc == 0
    (r,) = json.loads((out / "results.json").read_text())
    assert r["variant"] == "hybrid+sla" and r["sla_admission"] and r["sla_margin"] == 0.8
    for cls in ("P0", "P1", "P2", "P3"):
        for key in ("sla_attainment", "refused", "goodput_requests_per_s", "retries"):
            assert key in r["classes"][cls]
    assert "goodput_requests_per_s" in r and "retry_share" in r
    report = (out / "report.md").read_text()
    assert "## Goodput and SLA admission" in report and "TTFT predictor error" in report
    assert (out / "goodput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # (With --replicas it is the fleet ingress's admission: test_sim_fleet_ingress.py.)
    assert (
        main(["simulate", "--sla-admission", "on", "--scenario", "fleet", "--out", str(out)]) == 2
    )
    assert main(["simulate", "--sla-admission", "on", "--sla-margin", "0", "--out", str(out)]) == 2


def test_the_sla_scenario_puts_the_seed_grid_beside_sla_admission():
    cfgs = seed_table_sla_configs()
    labels = {(c.label, c.workload.concurrency) for c in cfgs}
    for c in (32, 64, 128, 256, 512):
        assert {
            ("fcfs", c),
            ("drr", c),
            ("hybrid", c),
            ("fcfs+sla", c),
            ("hybrid+sla", c),
        } <= labels
    assert all(c.max_retries == 3 for c in cfgs)


def test_retry_after_is_what_the_header_says():
    assert [retry_after_seconds(x) for x in (None, 0.0, 0.2, 1.0, 1.01, 59.5)] == [
        1,
        1,
        1,
        1,
        2,
        60,
    ]
