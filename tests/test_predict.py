"""The online output-length predictor (core/predict): sketch, features, fallbacks, decay, bounded
memory, error record, state on disk."""

from __future__ import annotations

import json
import logging
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tierserve.core.predict import (
    LengthPredictor,
    PredictorConfig,
    default_path,
    load_state,
    save_state,
)
from tierserve.core.predict.features import Features, pow2_bucket, template_hash
from tierserve.core.predict.sketch import (
    EDGES,
    MAX_LENGTH,
    NUM_BUCKETS,
    DecayingHistogram,
    bucket_of,
)
from tierserve.priority import Priority
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams

_n = 0


def req(tenant="t", prio=Priority.P1, system=7, prompt=100, max_tokens=1000, stop=()) -> Request:
    global _n
    _n += 1
    toks = [system] * 40 + [1000 + _n] * max(1, prompt - 40)
    return Request(f"r{_n}", toks, SamplingParams(max_tokens=max_tokens, stop=stop), prio, tenant)


# -- sketch --------------------------------------------------------------------------------------
@given(st.integers(0, 3_000_000))
def test_bucket_of_holds_the_length(n):
    b = bucket_of(n)
    m = min(n, MAX_LENGTH)  # longer lengths count in the last bucket
    assert 0 <= b < NUM_BUCKETS
    assert EDGES[b] <= m
    if b + 1 < NUM_BUCKETS:
        assert m < EDGES[b + 1]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 100_000), min_size=1, max_size=300), st.floats(0.0, 1.0))
def test_quantile_is_close_to_the_exact_one(xs, q):
    h = DecayingHistogram()
    for x in xs:
        h.add(x, 0.0, 60.0)
    got = h.quantile(q)
    s = sorted(xs)
    # the true quantile's neighbours, each widened by one bucket (relative width <= 25%, +1)
    lo = s[max(0, int(q * len(s)) - 1)]
    hi = s[min(len(s) - 1, int(q * len(s)))]
    assert lo / 1.3 - 1 <= got <= hi * 1.3 + 1
    assert h.quantile(0.5) <= h.quantile(0.9) <= h.quantile(1.0)


def test_decay_halves_the_weight_per_half_life():
    h = DecayingHistogram()
    h.add(10, 0.0, 100.0)
    assert h.total(100.0, 100.0) == pytest.approx(0.5)
    h.add(1000, 200.0, 100.0)  # the old point now weighs 1/4
    assert h.total() == pytest.approx(1.25)
    assert h.quantile(0.5) >= 800  # the recent point dominates


# -- features ------------------------------------------------------------------------------------
def test_features_and_keys():
    a = req(tenant="x", system=5, prompt=300, max_tokens=64)
    f = Features.of(a)
    assert (f.tenant, f.cls, f.max_tokens, f.prompt_tokens, f.constrained, f.stop) == (
        "x",
        1,
        64,
        300,
        False,
        "eos",
    )
    assert Features.of(req(stop=("\n",))).stop == "stop"
    keys = f.key_chain()
    assert [k.split("|")[0] for k in keys] == ["full", "template", "tenant", "class", "global"]
    # same system prompt, other question: same template; another system prompt: another one
    assert Features.of(req(system=5)).template == f.template
    assert Features.of(req(system=6)).template != f.template
    assert template_hash([1, 2]) != template_hash([3, 2])
    assert [pow2_bucket(n) for n in (0, 1, 2, 3, 4, 5, 4096)] == [0, 0, 1, 2, 2, 3, 12]


# -- predictor -----------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 100_000), min_size=1, max_size=300),
    st.integers(0, 120_000),
    st.floats(0.0, 1.0),
)
def test_quantile_above_is_close_to_the_exact_conditional_one(xs, floor, q):
    """The survival quantile: the `q`-quantile of the lengths above `floor`, within the same
    bucket tolerance as the plain quantile, and never at or below `floor`."""
    h = DecayingHistogram()
    for x in xs:
        h.add(x, 0.0, 60.0)
    got, weight = h.quantile_above(q, floor)
    above = sorted(x for x in xs if x > floor)
    straddling = sum(1 for x in xs if bucket_of(x) == bucket_of(floor))
    # the weight: every length above floor's bucket, and a share of floor's own bucket
    assert len(above) - straddling - 1e-9 <= weight <= len(above) + straddling + 1e-9
    if weight == 0:
        assert got == 0 and not above
        return
    assert got > floor
    if not above:  # only floor's bucket, read as uniform: the answer stays inside it
        assert bucket_of(got) == bucket_of(floor)
        return
    # The sketch reads floor's own bucket as uniform, so its share of the rank can be off by
    # at most the lengths in it: the answer lies within a bucket of the exact conditional
    # quantiles at ranks q * weight -/+ that many, or inside floor's bucket.
    rank = q * weight
    lo = above[min(len(above) - 1, max(0, math.floor(rank - straddling) - 1))]
    hi = above[min(len(above) - 1, max(0, math.ceil(rank + straddling)))]
    in_floor_bucket = rank <= straddling + 1e-9 and bucket_of(got) == bucket_of(floor)
    assert got >= lo / 1.3 - 1 or in_floor_bucket
    assert got <= hi * 1.3 + 1


def test_quantile_above_nothing_seen_and_below_everything():
    h = DecayingHistogram()
    assert h.quantile_above(0.5, 10) == (0.0, 0.0)
    for x in (100, 200, 300):
        h.add(x, 0.0, 60.0)
    assert h.quantile_above(0.5, 0) == (h.quantile(0.5), h.total())  # no condition at all
    assert h.quantile_above(0.5, 10_000) == (0.0, 0.0)
    with pytest.raises(ValueError, match="quantile"):
        h.quantile_above(1.5, 0)


def test_a_request_that_outran_its_median_is_predicted_by_its_survival():
    """Half the requests of a template end at ~10 tokens, half at ~500. One that has produced
    50 is one of the long ones: its survival median is ~500, not the template's P50 (~10). One
    beyond all seen is predicted to run as long again; never past max_tokens."""
    pred = LengthPredictor(PredictorConfig(min_weight=5))
    rng = random.Random(3)
    for i in range(200):
        pred.observe(req(system=1), rng.randint(8, 12) if i % 2 else rng.randint(450, 550), 0.0)
    assert pred.predict(req(system=1), 0.0).p50 <= 13
    assert 440 <= pred.predict_beyond(req(system=1), 50, 0.0) <= 560
    assert pred.predict_beyond(req(system=1), 50, 0.0, q=0.9) >= 520
    assert pred.predict_beyond(req(system=1, max_tokens=9000), 2000, 0.0) == 4000  # as long again
    assert pred.predict_beyond(req(system=1, max_tokens=600), 2000, 0.0) == 2001  # past its cap
    assert pred.predict_beyond(req(system=1, max_tokens=300), 50, 0.0) == 300
    # cold: as long again
    assert LengthPredictor().predict_beyond(req(), 30, 0.0) == 60


def test_cold_start_predicts_max_tokens():
    p = LengthPredictor().predict(req(max_tokens=333), 0.0)
    assert (p.p50, p.p90, p.level) == (333, 333, "none")


def test_learns_per_template_and_falls_back_to_coarser_keys():
    pred = LengthPredictor(PredictorConfig(min_weight=5))
    rng = random.Random(1)
    for _ in range(200):
        pred.observe(req(tenant="a", system=1), rng.randint(18, 22), 0.0)
        pred.observe(req(tenant="a", system=2), rng.randint(450, 550), 0.0)
    short = pred.predict(req(tenant="a", system=1), 0.0)
    long = pred.predict(req(tenant="a", system=2), 0.0)
    assert short.level == "full" and 17 <= short.p50 <= 23 and short.p90 <= 25
    assert long.level == "full" and 440 <= long.p50 <= 560
    # a new template of tenant a: the tenant's mix (half short, half long)
    mixed = pred.predict(req(tenant="a", system=3), 0.0)
    assert mixed.level == "tenant" and mixed.p90 >= 400
    # another tenant, same class: the class; another class: global
    assert pred.predict(req(tenant="b", system=1), 0.0).level == "class"
    assert pred.predict(req(tenant="b", prio=Priority.P3), 0.0).level == "global"
    # never above max_tokens
    assert pred.predict(req(tenant="a", system=2, max_tokens=100), 0.0).p90 <= 100


def test_old_observations_fade():
    pred = LengthPredictor(PredictorConfig(half_life_s=10.0, min_weight=3))
    for _ in range(50):
        pred.observe(req(), 20, 0.0)
    assert pred.predict(req(), 1.0).p50 <= 25
    for _ in range(10):
        pred.observe(req(), 800, 100.0)  # ten half-lives later: the 20s weigh ~0.05
    assert pred.predict(req(), 100.0).p50 >= 640
    # with nothing new for long, every key falls below min_weight: cold again
    assert pred.predict(req(max_tokens=77), 1000.0).level == "none"


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.lists(st.integers(0, 500), min_size=1, max_size=200))
def test_memory_is_bounded(max_keys, systems):
    pred = LengthPredictor(PredictorConfig(max_keys=max_keys))
    for s in systems:
        pred.observe(req(system=s, tenant=f"t{s % 7}"), 10, 0.0)
    # fine keys bounded by max_keys; class + global: at most 5 more
    assert len(pred) <= max_keys + 5


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 3), st.integers(1, 5000)),
        min_size=1,
        max_size=80,
    ),
    st.integers(1, 4000),
)
def test_prediction_is_ordered_and_capped(obs, cap):
    pred = LengthPredictor(PredictorConfig(min_weight=1))
    for tenant, cls, n in obs:
        pred.observe(req(tenant=str(tenant), prio=Priority(cls)), n, 0.0)
    p = pred.predict(req(tenant="1", prio=Priority.P2, max_tokens=cap), 0.0)
    assert 1 <= p.p50 <= p.p90 <= cap


def test_error_record_per_class():
    pred = LengthPredictor(PredictorConfig(min_weight=1))
    for n in (100, 100, 100, 400):
        r = req(prio=Priority.P2)
        pred.observe(r, n, 0.0, pred.predict(r, 0.0))
    e = pred.error_stats()["P2"]
    assert e["cold"] == 1  # the first guess was max_tokens: not a prediction, not counted
    assert e["n"] == 3
    assert e["within_p90"] == pytest.approx(2 / 3, abs=1e-3)  # 100, 100 within P90; 400 not
    assert e["abs_error_p50"] < 5 and e["abs_error_p90"] >= 250
    assert pred.error_stats()["P0"]["n"] == 0


# -- state on disk -------------------------------------------------------------------------------
def _trained() -> LengthPredictor:
    pred = LengthPredictor(PredictorConfig(min_weight=2))
    for n in (10, 12, 14, 300, 320):
        pred.observe(req(tenant="a"), n, 5.0)
    return pred


def test_state_round_trips_through_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TIERSERVE_CACHE_DIR", str(tmp_path))
    pred = _trained()
    path = save_state(pred)
    assert path == default_path() == tmp_path / "predictor" / "lengths.json"
    again = LengthPredictor(PredictorConfig(min_weight=2))
    assert load_state(again) is None
    probe = req(tenant="a")
    assert again.predict(probe, 5.0) == pred.predict(probe, 5.0)
    assert again.to_json() == pred.to_json()


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        json.dumps({"version": 99, "sketches": {}}),
        json.dumps({"version": 1, "sketches": {"bogus|x": {"t": 0, "w": {}}}}),
        json.dumps({"version": 1, "sketches": {"global": {"t": 0, "w": {"9999": 1}}}}),
        json.dumps({"version": 1, "sketches": {"global": {"t": 0, "w": {"3": -1}}}}),
        json.dumps({"version": 1, "sketches": {"global": {"t": 0, "w": {"x": 1}}}}),
        json.dumps({"version": 1, "sketches": {"global": "nope"}}),
        b"\xff\xfe{ not utf-8",
    ],
)
def test_a_corrupt_state_is_ignored_with_a_warning(tmp_path, caplog, text):
    path = tmp_path / "lengths.json"
    path.write_bytes(text) if isinstance(text, bytes) else path.write_text(text)
    pred = _trained()
    before = pred.to_json()
    with caplog.at_level(logging.WARNING):
        msg = load_state(pred, path)
    assert msg is not None and str(path) in msg and "ignored" in msg
    assert any("corrupt" in r.message for r in caplog.records)
    assert pred.to_json() == before  # nothing half-restored
    aside = tmp_path / "lengths.json.corrupt"
    assert aside.read_bytes() == (text if isinstance(text, bytes) else text.encode())
    assert not path.exists()  # kept for a person to look at
    assert str(aside) in msg


def test_a_missing_state_is_a_cold_start(tmp_path):
    pred = LengthPredictor()
    assert load_state(pred, tmp_path / "none.json") is None
    assert len(pred) == 0
