"""The heavy-tailed workload (sim/heavy_tail.py) and predictive scheduling on the simulator."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from tierserve.sim.engine.runner import SimConfig, run_simulation
from tierserve.workloads import make_workload
from tierserve.workloads.heavy_tail import TEMPLATES, HeavyTailWorkload
from tierserve.workloads.synthetic import Workload, WorkloadConfig

SMALL = SimConfig(
    hardware="h100-80gb",
    model="llama-3.1-8b",
    tp=1,
    max_num_seqs=64,
    max_num_batched_tokens=1024,
    num_kv_blocks=2500,  # ~40k tokens: tight for 48 clients, so the reservation has work
    workload=WorkloadConfig(
        concurrency=48, duration_s=40.0, warmup_s=10.0, seed=3, lengths="heavy_tail"
    ),
)


def test_make_workload_picks_the_kind():
    assert type(make_workload(WorkloadConfig())) is Workload
    assert isinstance(make_workload(WorkloadConfig(lengths="heavy_tail")), HeavyTailWorkload)
    with pytest.raises(ValueError, match="lengths"):
        WorkloadConfig(lengths="zipf")


def test_heavy_tailed_lengths_by_template_are_reproducible():
    def draw(seed):
        wl = HeavyTailWorkload(WorkloadConfig(seed=seed))
        reqs = [wl.make(0.0) for _ in range(3000)]
        return reqs, wl.output_lengths

    reqs, lengths = draw(1)
    again, lengths2 = draw(1)
    assert [r.prompt_token_ids for r in reqs] == [r.prompt_token_ids for r in again]
    assert lengths == lengths2
    by_template: dict[int, list[int]] = {}
    for r in reqs:
        assert r.sampling_params.max_tokens >= lengths[r.request_id] >= 1
        assert not r.sampling_params.ignore_eos and r.eos_token_id is not None
        by_template.setdefault(r.prompt_token_ids[0], []).append(lengths[r.request_id])
    assert len(by_template) == len(TEMPLATES)
    spread = {
        TEMPLATES[k - 200].name: statistics.quantiles(v, n=10)[-1] / statistics.median(v)
        for k, v in by_template.items()
    }
    # predictable templates: P90 within ~1.5x of the median; the agent and chat: far beyond
    assert spread["faq"] < 1.5 and spread["report"] < 1.5 and spread["summary"] < 1.5
    assert spread["agent"] > 10 and spread["chat"] > 3


def test_the_simulated_model_stops_at_the_drawn_length_and_the_predictor_learns():
    r = run_simulation(SMALL, keep_records=True)
    assert r["failed"] == 0 and r["completed"] > 100
    done = [x for x in r["records"] if x.outcome == "completed"]
    assert any(x.output_tokens < x.max_tokens for x in done)  # ended by EOS, not max_tokens
    err = r["predictor_error"]
    assert err["P1"]["n"] > 50 and err["P2"]["n"] > 20
    assert 0.5 < err["P2"]["within_p90"] <= 1.0


def test_predictive_runs_are_reproducible_and_reserve_cuts_preemptions():
    on = replace(SMALL, predictive_order_s=5.0, predictive_reserve=True)
    a, b = run_simulation(on), run_simulation(on)
    strip = lambda r: {k: v for k, v in r.items() if k != "wall_s"}  # noqa: E731
    assert strip(a) == strip(b)
    off = run_simulation(SMALL)
    pre = lambda r: r["preemptions"]["swap"] + r["preemptions"]["recompute"]  # noqa: E731
    assert pre(off) > 0
    assert pre(a) < pre(off)
    assert a["reservation_waits"] > 0 and off["reservation_waits"] == 0
    assert a["failed"] == 0 and a["config"]["predictive_reserve"] is True
