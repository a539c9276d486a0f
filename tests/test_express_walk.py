"""The TTFT predictor's view of P0 bursts (admission/engine_rate.py ``express_seconds``,
admission/load_meter.py ``computed_share``): first tokens come at the end of the step that
finishes a prompt, steps are as full as the step bound allows, and a prompt costs only what the
prefix cache does not hold."""

from __future__ import annotations

import pytest

from tierserve.admission.engine_rate import EngineShape
from tierserve.admission.load_meter import MIN_SHARE, LoadMeter
from tierserve.core.step_time import StepCoefficients

# overhead 5 ms, 1 ms per token computed: a 10-token prompt costs 10 ms of a step
COEF = StepCoefficients((0.005, 0.0, 0.001, 0.0, 0.0, 0.0), calibrated=True)


def shape(bound_s=0.15, budget=8192, seqs=256, coef=COEF) -> EngineShape:
    return EngineShape(coef, bound_s, budget, seqs, decodes=0, decode_context=0)


def test_a_burst_is_walked_step_by_step():
    s = shape()
    # 0.145 s of room per step: 14 ten-token prompts in the first step, all done at its end
    assert s.express_seconds(0, 0, 10, 1.0) == pytest.approx(0.015)
    assert s.express_seconds(13, 130, 10, 1.0) == pytest.approx(0.145)
    # the 15th is in the second step, beside the 14 decodes of the first (14 ms)
    assert s.express_seconds(14, 140, 10, 1.0) == pytest.approx(0.145 + 0.005 + 0.014 + 0.010)
    times = [s.express_seconds(n, 10 * n, 10, 1.0) for n in range(60)]
    assert times == sorted(times)


def test_without_a_bound_the_token_budget_sizes_the_steps():
    s = shape(bound_s=None, budget=100)
    assert s.express_seconds(9, 90, 10, 1.0) == pytest.approx(0.005 + 0.1)
    # the 11th waits for the first step (10 prompts) and shares the next with 10 decodes
    assert s.express_seconds(10, 100, 10, 1.0) == pytest.approx(0.105 + 0.005 + 0.01 + 0.01)


def test_a_cached_prefix_is_not_priced():
    s = shape()
    whole = s.express_seconds(20, 200, 10, 1.0)
    assert s.express_seconds(20, 400, 20, 0.5) == pytest.approx(whole)


def test_uncalibrated_model_predicts_nothing():
    assert shape(coef=StepCoefficients()).express_seconds(3, 30, 10, 1.0) is None


def test_the_computed_share_follows_the_prefix_caches_hits():
    m = LoadMeter()
    assert m.computed_share(0, 0) == 1.0
    assert m.computed_share(1000, 600) == pytest.approx(0.4)
    assert m.computed_share(1000, 600) == pytest.approx(0.4)  # nothing new: unchanged
    # a long run of fresh prompts brings it back toward 1
    assert m.computed_share(50_000, 600) > 0.99
    assert LoadMeter().computed_share(1000, 1000) == MIN_SHARE
