"""Speculative decoding in the core: the n-gram drafter, the goodput rule, and drafts verified
through the real scheduler, KV manager and the KV-simulating fake executor (whose tokens are
read back from KV slots, so a slot of a rejected draft left in use corrupts the output)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_engine_properties import build as build_engine
from tests.test_engine_properties import drive_specs, make_specs, to_request
from tierserve.core.speculation import (
    SpecConfig,
    Speculation,
    expected_tokens,
    parse_speculative_config,
    pick_draft_len,
    propose_ngram,
)
from tierserve.executor.fake import next_token
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams

# -- the drafter ---------------------------------------------------------------------------


def test_ngram_proposes_the_continuation_of_the_latest_match():
    toks = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert propose_ngram(toks, 2, n_max=3, n_min=2) == [7, 8]  # the latest "1 2 3"
    assert propose_ngram(toks, 5, n_max=3, n_min=2) == [7, 8, 5, 1, 2]
    assert propose_ngram([4, 5, 6], 3, 3, 2) == []  # nothing repeats
    assert propose_ngram(toks, 0, 3, 2) == []


def test_ngram_prefers_the_longest_suffix():
    # "2 3" last occurred before 4; "1 2 3" only before 6
    toks = [1, 2, 3, 6, 0, 2, 3, 4, 0, 1, 2, 3]
    assert propose_ngram(toks, 1, n_max=3, n_min=2) == [6]
    assert propose_ngram(toks, 1, n_max=2, n_min=2) == [4]


@given(st.lists(st.integers(0, 5), min_size=0, max_size=60), st.integers(1, 6))
@settings(max_examples=200, deadline=None)
def test_ngram_drafts_always_continue_a_real_earlier_match(toks, k):
    drafts = propose_ngram(toks, k, 4, 2)
    assert len(drafts) <= k
    if drafts:  # some n in [2, 4]: the last n tokens occur earlier, followed by the drafts
        ok = any(
            toks[i : i + n] == toks[-n:] and toks[i + n : i + n + len(drafts)] == drafts
            for n in range(2, 5)
            for i in range(len(toks) - n)
        )
        assert ok


# -- the rule ----------------------------------------------------------------------------


def test_expected_tokens_is_the_geometric_series():
    assert expected_tokens(0.0, 4) == pytest.approx(1.0)
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(0.9, 3) == pytest.approx(1 + 0.9 + 0.81 + 0.729)


def test_rule_speculates_when_memory_bound_and_stops_when_compute_bound():
    # Memory-bound: a draft costs 2% of the step. Compute-bound: a draft costs a decode's share.
    assert pick_draft_len(0.7, 6, tokens=1, step_s=0.02, extra_s=lambda k: 0.0004 * k) >= 3
    assert pick_draft_len(0.7, 6, tokens=32, step_s=0.32, extra_s=lambda k: 0.01 * k) == 0
    # Acceptance falls: no drafts even when they are nearly free
    assert pick_draft_len(0.02, 6, tokens=1, step_s=0.02, extra_s=lambda k: 0.002 * k) == 0
    assert pick_draft_len(0.7, 6, tokens=1, step_s=0.0, extra_s=lambda k: 0.0) == 0  # no model


def test_acceptance_is_measured_per_class_per_compared_draft():
    spec = Speculation(SpecConfig(prior_acceptance=0.5))
    for _ in range(200):
        spec.observe(0, drafted=4, accepted=4, emitted=5)
        spec.observe(3, drafted=4, accepted=0, emitted=1)
    assert spec.acceptance(0) > 0.9 and spec.acceptance(3) < 0.1
    assert spec.acceptance(1) == pytest.approx(0.5)  # never observed: the prior
    assert spec.counts.drafted[0] == 800 and spec.counts.emitted[3] == 200


def test_a_request_in_a_rejecting_phase_is_expected_to_accept_less_than_its_class():
    # Acceptance comes in phases (copying the input, then writing anew): a request's own last
    # verifications move its estimate away from its class's, and a fresh one gets the class's.
    spec = Speculation(SpecConfig(prior_acceptance=0.5))
    copying, writing, fresh = (
        Request(rid, [1, 2, 3], SamplingParams(max_tokens=8)) for rid in "abc"
    )
    for _ in range(20):
        spec.observe_request(copying, drafted=4, accepted=4)
        spec.observe_request(writing, drafted=4, accepted=0)
    cls = spec.acceptance(fresh.priority)  # their class's: 4 of 4, then 0 of 1 compared
    assert spec.acceptance_of(fresh) == pytest.approx(cls)
    assert spec.acceptance_of(writing) < 0.4 < cls < spec.acceptance_of(copying)
    # the rule then drafts for the copying request and not for the writing one
    flat = lambda k: 0.002 * k  # noqa: E731 (each draft adds 2 ms to a 20 ms step of 4 tokens)
    assert pick_draft_len(spec.acceptance_of(copying), 4, 4, 0.020, flat) == 4
    assert pick_draft_len(spec.acceptance_of(writing), 4, 4, 0.020, flat) == 0
    # decayed: the writing request's estimate recovers within a few accepted verifications
    for _ in range(4):
        spec.observe_request(writing, drafted=4, accepted=4)
    assert spec.acceptance_of(writing) > cls


def test_speculative_config_takes_vllm_keys_and_names_bad_ones():
    cfg = parse_speculative_config(
        '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5, '
        '"prompt_lookup_min": 1}'
    )
    assert (cfg.num_speculative_tokens, cfg.prompt_lookup_max, cfg.prompt_lookup_min) == (3, 5, 1)
    assert parse_speculative_config("off") is None and parse_speculative_config(None) is None
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        parse_speculative_config('{"num_speculative_tokens": 0}')
    with pytest.raises(ValueError, match="unknown key"):
        parse_speculative_config('{"num_spec_tokens": 3}')
    with pytest.raises(ValueError, match="needs 'model'"):
        parse_speculative_config('{"method": "draft_model"}')
    with pytest.raises(ValueError, match="'model' is for method 'draft_model'"):
        parse_speculative_config('{"method": "ngram", "model": "x.gguf"}')
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_speculative_config("{num_speculative_tokens: 3")
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        parse_speculative_config('{"prompt_lookup_min": 5, "prompt_lookup_max": 2}')


# -- drafts through the real scheduler ----------------------------------------------------


def oracle(rng: random.Random, wrong: float):
    """Drafts the fake model's true continuation, each draft wrong with probability `wrong`."""

    def draft(tokens: list[int], k: int) -> list[int]:
        seq, out = list(tokens), []
        for _ in range(k):
            t = next_token(seq, 1000)
            if rng.random() < wrong:
                t = (t + 1) % 1000
            out.append(t)
            seq.append(t)
        return out

    return draft


def run(specs, policy, blocks, mode, speculation=None):
    eng, clock = build_engine(policy, blocks, mode)
    eng.scheduler.speculation = speculation
    return drive_specs(eng, clock, specs)


@pytest.mark.parametrize(
    ("policy", "blocks", "mode", "wrong"),
    [("hybrid", 4096, "auto", 0.2), ("hybrid", 80, "swap", 0.3), ("strict", 80, "auto", 0.5)],
)
def test_drafts_never_change_outputs_and_every_block_comes_back(policy, blocks, mode, wrong):
    specs = make_specs(150, seed=5, max_out=40)
    reference, steps_off = run(specs, "fcfs", 4096, "recompute")
    classes = (0, 1, 2, 3)
    spec = Speculation(
        SpecConfig(num_speculative_tokens=4, classes=classes, prior_acceptance=0.9),
        drafter=oracle(random.Random(1), wrong),
    )
    got, steps_on = run(specs, policy, blocks, mode, spec)
    assert got == reference  # token for token, finish reasons too, with rejections in the mix
    if blocks == 4096:  # no memory pressure: drafts accepted are steps saved
        assert steps_on < 0.8 * steps_off, (steps_on, steps_off)
    c = spec.counts
    assert sum(c.accepted) > 0 and sum(c.drafted) > sum(c.accepted)  # both kinds happened
    assert sum(c.emitted) == sum(c.accepted) + sum(c.verifications)


# -- who drafts: the rule inside the scheduler ------------------------------------------------


class FixedTime:
    """A step-time model that has learnt `coef` (seconds per feature) and learns nothing more."""

    def __init__(self, coef):
        from tierserve.core.step_time import StepCoefficients

        self.coefficients = StepCoefficients(coef, calibrated=True)

    def observe(self, work, seconds):
        pass


# (overhead, per seq, per token, per context token, per attention pair, per logits row):
# a memory-bound machine (weights streamed once per step: the overhead dominates), and a
# compute-bound one (every token costs as much as the overhead shared by 32).
MEMORY_BOUND = (0.02, 1e-5, 2e-4, 0.0, 1e-8, 1e-4)
COMPUTE_BOUND = (0.005, 1e-5, 0.01, 0.0, 1e-8, 1e-4)


def drafting(priorities, coef, max_tokens=50, pass_s=None, wait_s=0.0, engine=None):
    """Run requests of these classes to their first decodes; drafted tokens per class.
    `pass_s`: seconds a draft model's pass takes (None: drafts cost nothing to propose);
    `wait_s`: how long they wait before the first step (hybrid ages a waiting P3 to P2 after
    5 s and a P2 to P1 after 15 s); `engine`: a list that gets the engine."""
    eng, clock = build_engine("hybrid", 4096, "auto")
    s = eng.scheduler
    s.step_time = FixedTime(coef)
    cfg = SpecConfig(prior_acceptance=0.8)  # default classes: P0 and P1
    cost = None if pass_s is None else (lambda: pass_s)
    s.speculation = Speculation(cfg, oracle(random.Random(0), 0.0), draft_pass_s=cost)
    specs = make_specs(len(priorities), seed=9, max_prompt=60, max_out=max_tokens)
    for i, (sp, p) in enumerate(zip(specs, priorities, strict=True)):
        req = to_request(sp, clock.now())
        req.priority = req.base_priority = p
        req.request_id = f"r{i}"
        req.sampling_params = type(req.sampling_params)(max_tokens=max_tokens, temperature=0.0)
        eng.add_request(req)
    clock.advance(wait_s)
    for _ in range(8):
        eng.step()
        clock.advance(0.01)
    if engine is not None:
        engine.append(eng)
    return s.speculation.counts.drafted


def test_a_lone_p0_drafts_on_a_memory_bound_step_and_a_full_batch_does_not():
    assert drafting([0], MEMORY_BOUND)[0] > 0
    assert drafting([1] * 32, COMPUTE_BOUND)[1] == 0  # P1 drafts for throughput only


def test_a_draft_model_as_slow_as_the_step_never_drafts_and_a_fast_one_does():
    # the memory-bound step lasts ~20 ms: a pass of 20 ms per draft token cannot pay at 0.8
    assert drafting([0], MEMORY_BOUND, pass_s=0.02)[0] == 0
    assert drafting([0], MEMORY_BOUND, pass_s=0.002)[0] > 0


def test_p2_and_p3_draft_only_when_alone():
    assert drafting([3], MEMORY_BOUND)[3] > 0  # alone: the engine is otherwise idle
    counts = drafting([0, 3, 2], MEMORY_BOUND)
    assert counts[0] > 0 and counts[2] == 0 and counts[3] == 0


def test_a_background_request_aged_into_p1_still_drafts_only_as_p3():
    # 15 P3 requests waited 25 s: aging promoted them to P1 (so that they are admitted), and
    # they run as P1. Their drafts and their acceptance remain those of the class they were
    # submitted with: beside a P0 they do not draft (the flood's background kept drafting as
    # P1 before), and the P0 still does.
    got = []
    counts = drafting([0] + [3] * 15, MEMORY_BOUND, wait_s=25.0, engine=got)
    aged = [r for r in got[0].scheduler.running.values() if r.base_priority == 3]
    assert aged and all(r.priority == 1 for r in aged)  # promoted, and running
    assert counts[0] > 0
    assert counts[1] == 0 and counts[3] == 0
    # the same P3 requests submitted as P1 do draft on this memory-bound step
    assert drafting([0] + [1] * 15, MEMORY_BOUND)[1] > 0


def test_p0_drafts_for_its_own_latency_within_the_throughput_floor():
    # A step of 16 decodes (30 ms); each draft adds 1.5 ms (5%): throughput says no drafts,
    # latency lets P0 draft while the step keeps >= 97% of its rate.
    def extra(k):
        return 0.0015 * k

    assert pick_draft_len(0.6, 4, tokens=16, step_s=0.03, extra_s=extra) == 0
    k = pick_draft_len(0.6, 4, tokens=16, step_s=0.03, extra_s=extra, floor=0.97)
    assert k >= 1
    rate = (15 + expected_tokens(0.6, k)) / (0.03 + extra(k))
    assert rate >= 0.97 * 16 / 0.03
    # the floor binds: at 10% a draft, no k keeps 97%
    assert pick_draft_len(0.6, 4, 16, 0.03, lambda k: 0.003 * k, floor=0.97) == 0


def test_a_p0_beside_a_background_flood_drafts_and_the_flood_does_not():
    # 15 P3 decodes beside one P0: with the latency rule P0 drafts; P3 never does beside it
    counts = drafting([0] + [3] * 15, (0.02, 1e-5, 5e-4, 0.0, 1e-8, 1e-4))
    assert counts[0] > 0 and counts[3] == 0
