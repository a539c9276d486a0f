"""Priority parsing, the request state machine, sampling and config validation."""

import pytest

from tests.helpers import make_request
from tierserve.clock import ManualClock
from tierserve.config import ConfigError, PolicyConfig, PriorityConfig, SchedulerConfig
from tierserve.grammar import GrammarSpec
from tierserve.priority import Priority, parse_priority
from tierserve.request import IllegalTransition, RequestStatus
from tierserve.sampling_params import SamplingParams

S = RequestStatus


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("realtime", 0),
        ("ONLINE", 1),
        ("batch", 2),
        ("background", 3),
        ("p0", 0),
        ("P3", 3),
        (0, 0),
        (3, 3),
        ("2", 2),
        (Priority.P1, 1),
    ],
)
def test_parse_priority_accepts_names_labels_and_ints(value, expected):
    assert parse_priority(value) == Priority(expected)


@pytest.mark.parametrize("value", ["urgent", 4, -1, True, 1.5, None, "p9"])
def test_parse_priority_rejects_with_valid_values_listed(value):
    with pytest.raises(ValueError, match=r"realtime|0\.\.3"):
        parse_priority(value)


def test_state_machine_allows_the_documented_paths():
    r = make_request()
    for s in (S.RUNNING, S.PREEMPTED, S.RUNNING, S.SWAPPED, S.RUNNING, S.FINISHED):
        r.transition(s)
    assert r.is_finished


@pytest.mark.parametrize(
    "path",
    [
        [S.FINISHED],  # waiting cannot finish without running
        [S.SWAPPED],
        [S.RUNNING, S.WAITING],
        [S.RUNNING, S.FINISHED, S.RUNNING],
        [S.ABORTED, S.RUNNING],
        [S.RUNNING, S.SWAPPED, S.FINISHED],
    ],
)
def test_state_machine_rejects_illegal_transitions(path):
    r = make_request()
    with pytest.raises(IllegalTransition, match="illegal transition"):
        for s in path:
            r.transition(s)


@pytest.mark.parametrize("state", [S.WAITING, S.RUNNING, S.SWAPPED, S.PREEMPTED])
def test_abort_and_fail_are_allowed_from_every_live_state(state):
    for final in (S.ABORTED, S.FAILED):
        r = make_request()
        if state != S.WAITING:
            r.transition(S.RUNNING)
        if state in (S.SWAPPED, S.PREEMPTED):
            r.transition(state)
        r.transition(final)
        assert r.is_finished


def test_request_rejects_empty_prompt():
    with pytest.raises(ValueError, match="no tokens"):
        make_request(tokens=[])


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"repetition_penalty": 0.0}, "repetition_penalty"),
        ({"logit_bias": {5: 101}}, "logit_bias"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"top_logprobs": 21}, "top_logprobs"),
        ({"grammar": GrammarSpec.json_object(), "ignore_eos": True}, "ignore_eos"),
        ({"grammar": GrammarSpec.json_object(), "min_tokens": 2}, "min_tokens"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": -2}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"stop": [""]}, "stop"),
    ],
)
def test_sampling_params_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


def test_single_stop_string_becomes_a_tuple():
    assert SamplingParams(stop="###").stop == ("###",)


@pytest.mark.parametrize(
    ("factory", "match"),
    [
        (lambda: PriorityConfig(ttft_sla_s=(0.5, 5.0, 60.0)), "4 values"),
        (lambda: PriorityConfig(ttft_sla_s=(0, 5.0, 60.0, None)), "positive"),
        (lambda: SchedulerConfig(max_num_seqs=0), "max_num_seqs"),
        (lambda: SchedulerConfig(preemption_mode="pause"), "preemption_mode"),
        (lambda: PolicyConfig(drr_weights=(8, 4, -2, 1)), "negative"),
        (lambda: PolicyConfig(wfq_weights=(16, 8, 0, 2)), "positive"),
        (lambda: PolicyConfig(aging_thresholds_s=(None, 5.0, 15.0, 30.0)), "out of order"),
        (lambda: PolicyConfig(aging_thresholds_s=(1.0, 30.0, 15.0, 5.0)), "P0"),
    ],
)
def test_bad_config_is_refused(factory, match):
    with pytest.raises(ConfigError, match=match):
        factory()


def test_default_sla_table():
    cfg = PriorityConfig()
    assert [cfg.sla(p) for p in Priority] == [0.5, 5.0, 60.0, None]


def test_manual_clock_never_goes_back():
    c = ManualClock(1.0)
    c.advance(0.5)
    assert c.now() == 1.5
    with pytest.raises(ValueError):
        c.advance(-1)
    with pytest.raises(ValueError):
        c.set(1.0)


def test_test_prompts_do_not_depend_on_the_process_hash_seed():
    """tests/helpers built prompts from hash(), which is salted per process (issue 14, item 11)."""
    import subprocess
    import sys

    code = (
        "from tests.helpers import make_request; "
        "print(make_request(8, request_id='fixed-id').prompt_token_ids)"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outs) == 1
