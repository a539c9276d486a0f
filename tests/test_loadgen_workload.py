"""What the load generator sends: the simulator's workload (shared code, same draws), real
text cut to token counts, sharegpt-like datasets."""

import json

import pytest

from tests.loadgen_stub import word_tokenizer_file
from tierserve.loadgen.text import PromptMaker, TokenizerError, load_tokenizer
from tierserve.loadgen.workload import (
    DatasetError,
    DatasetSource,
    Gaps,
    RandomSource,
    class_specs,
    load_conversations,
)
from tierserve.priority import Priority
from tierserve.workloads.synthetic import CPU_CLASSES, DEFAULT_CLASSES, Workload, WorkloadConfig


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    return PromptMaker(
        load_tokenizer(word_tokenizer_file(tmp_path_factory.mktemp("tk") / "t.json"))
    )


def test_requests_follow_the_simulators_draws(prompts):
    cfg = WorkloadConfig(classes=class_specs("cpu"), seed=3)
    ours = RandomSource(cfg, prompts)
    sim = Workload(cfg)
    for _ in range(200):
        s, r = ours.next(), sim.make(0.0)
        assert s.priority == r.priority and s.max_tokens == r.sampling_params.max_tokens
        assert s.prompt_tokens == len(r.prompt_token_ids)
        assert prompts.count(s.prompt) == s.prompt_tokens  # real text, cut exactly
    first = [RandomSource(cfg, prompts).next() for _ in range(2)]
    assert first[0] == first[1]


def test_levels_send_the_same_work_with_different_text(prompts):
    cfg = WorkloadConfig(classes=class_specs("cpu"), seed=0)
    a, b = RandomSource(cfg, prompts, "0:0"), RandomSource(cfg, prompts, "0:1")
    for _ in range(20):
        x, y = a.next(), b.next()
        assert (x.priority, x.prompt_tokens, x.max_tokens) == (
            y.priority,
            y.prompt_tokens,
            y.max_tokens,
        )
        assert x.prompt != y.prompt and x.prompt.startswith(f"Request {x.index}. ")


def test_length_presets_scale_and_fixed_overrides():
    assert class_specs("sim") == DEFAULT_CLASSES and class_specs("cpu") == CPU_CLASSES
    half = class_specs("sim", 0.5)
    assert half[Priority.P3].prompt.median == 750 and half[Priority.P3].output.hi == 1024
    fixed = class_specs("sim", prompt_len=[128], output_len=[8, 16, 32, 64])
    wl = Workload(WorkloadConfig(classes=fixed, seed=1))
    for _ in range(100):
        r = wl.make(0.0)
        assert len(r.prompt_token_ids) == 128
        assert r.sampling_params.max_tokens == [8, 16, 32, 64][r.priority]
    with pytest.raises(ValueError, match="--prompt-len takes 1 or 4"):
        class_specs("sim", prompt_len=[1, 2])
    with pytest.raises(ValueError, match="unknown length preset"):
        class_specs("gpu")


def test_open_loop_gaps_are_the_simulators(prompts):
    g = Gaps("gamma", 4.0, 2.0, seed=5)
    sim = Workload(WorkloadConfig(arrival="gamma", rate=4.0, gamma_cv=2.0, seed=6))
    assert [g.next() for _ in range(50)] == [sim.gap() for _ in range(50)]
    with pytest.raises(ValueError, match="--request-rate must be positive"):
        Gaps("poisson", 0.0, 1.0, 0)


def test_sharegpt_like_datasets(tmp_path, prompts):
    path = tmp_path / "d.jsonl"
    lines = [
        {"conversations": [{"from": "human", "value": "Hi there"},
                           {"from": "gpt", "value": "Hello to you too friend"}]},
        {"messages": [{"role": "system", "content": "Be brief"},
                      {"role": "user", "content": "Why"}], "priority": "realtime"},
        {"conversations": [{"from": "gpt", "value": "no user turn: skipped"}]},
    ]  # fmt: skip
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    convs = load_conversations(path)
    assert len(convs) == 2
    assert convs[0].reply == "Hello to you too friend" and convs[1].priority == Priority.P0
    src = DatasetSource(convs, WorkloadConfig(mix=(0, 0, 1, 0), seed=0), prompts)
    got = {s.prompt: s for s in (src.next() for _ in range(4))}
    hi = got["Hi there"]
    assert hi.max_tokens == 5 and hi.priority == Priority.P2  # the reply's length; the mix
    assert hi.messages == ({"role": "user", "content": "Hi there"},)
    why = got["Be brief\n\nWhy"]
    assert why.priority == Priority.P0 and len(why.messages) == 2

    bad = tmp_path / "bad.jsonl"
    for text, needle in [
        ("{not json", r"bad.jsonl:1: not JSON"),
        ('{"turns": []}', "expected a 'conversations' or 'messages' list"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "a turn needs a known role"),
        ('{"messages": [{"role": "user", "content": "x"}], "priority": 9}', "invalid priority"),
        ("", "no conversation with a user turn"),
    ]:
        bad.write_text(text + "\n")
        with pytest.raises(DatasetError, match=needle):
            load_conversations(bad)
    with pytest.raises(DatasetError, match="no such file"):
        load_conversations(tmp_path / "missing.jsonl")


def test_bad_tokenizer_paths_are_named(tmp_path):
    with pytest.raises(TokenizerError, match=r"no tokenizer\.json"):
        load_tokenizer(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(TokenizerError, match="cannot read"):
        load_tokenizer(str(tmp_path))
