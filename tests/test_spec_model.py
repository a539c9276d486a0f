"""Speculative decoding through the real TorchExecutor on a tiny random Llama (built here with
transformers' from_config; nothing downloaded): greedy and seeded outputs token for token equal
to plain decoding with drafts accepted and rejected along the way, logprobs equal, and the
sampled distribution unchanged (two-sample chi-square on the tokens drafts decide)."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from tests.test_architectures import save_tiny
from tests.test_spec_core import MEMORY_BOUND, FixedTime
from tierserve import LLM
from tierserve.core.speculation import SpecConfig, Speculation
from tierserve.sampling_params import SamplingParams

pytestmark = pytest.mark.model

REPEAT = [11, 12, 13, 14, 15, 16, 17, 18] * 5  # prompt lookup has something to find


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama-spec")
    save_tiny(path, "LlamaForCausalLM", seed=3)
    return path


def llm(folder, spec: SpecConfig | None, **kw) -> LLM:
    out = LLM(model=str(folder), speculative_config=spec, activations="float32", **kw)
    # A memory-bound step model, so whether drafts pay does not depend on this machine's load
    # (what is tested here is what drafts do, not when the rule sends them).
    out.engine.scheduler.step_time = FixedTime(MEMORY_BOUND)
    return out


def spec_all(**kw) -> SpecConfig:
    return SpecConfig(classes=(0, 1, 2, 3), prior_acceptance=0.9, **kw)


def prompts(n: int) -> list[list[int]]:
    return [[*REPEAT[i % 8 :], 20 + i, *REPEAT[:16]] for i in range(n)]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, top_logprobs=2),
        SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=24, ignore_eos=True),
    ],
    ids=["greedy", "seeded"],
)
def test_outputs_and_logprobs_equal_plain_decoding(folder, params):
    plain = llm(folder, None).generate(prompts(6), params)
    fast = llm(folder, spec_all(num_speculative_tokens=5))
    if params.temperature:  # sampled text rarely repeats the prompt: draft from the answer,
        # every third draft wrong, so both outcomes happen
        answers = {tuple(p): o.token_ids for p, o in zip(prompts(6), plain, strict=True)}

        def drafter(tokens: list[int], k: int) -> list[int]:
            for p, ans in answers.items():
                if tuple(tokens[: len(p)]) == p:
                    done = len(tokens) - len(p)
                    return [
                        t if (done + j) % 3 else t + 1 for j, t in enumerate(ans[done : done + k])
                    ]
            return []

        sched = fast.engine.scheduler
        sched.speculation = Speculation(sched.speculation.config, drafter)
    got = fast.generate(prompts(6), params)
    c = fast.engine.scheduler.speculation.counts
    assert sum(c.accepted) > 0 and sum(c.drafted) > sum(c.accepted)  # both outcomes happened
    for a, b in zip(plain, got, strict=True):
        assert a.token_ids == b.token_ids
        assert all(
            math.isclose(x, y, abs_tol=2e-4) for x, y in zip(a.logprobs, b.logprobs, strict=True)
        )
        if params.top_logprobs:
            assert [t[0] for t in a.top_logprobs] == [t[0] for t in b.top_logprobs]


def test_a_request_that_opts_out_never_drafts(folder):
    fast = llm(folder, spec_all())
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, speculative=False)
    fast.generate(prompts(2), params)
    assert sum(fast.engine.scheduler.speculation.counts.drafted) == 0


def _pairs(engine_llm: LLM, n: int, params: SamplingParams) -> Counter:
    prompt = REPEAT[:24]
    outs = engine_llm.generate([prompt] * n, params)
    return Counter(tuple(o.token_ids[1:3]) for o in outs)


def _chi2_quantile(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.09: 99.9%)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_sampled_distribution_is_the_targets(folder):
    """Unseeded sampling over the top 3 tokens: output tokens 1 and 2 (the first verification
    samples token 1 and, when its draft was right, token 2 in the same step) have the same joint
    distribution with drafts as without. The drafter proposes the most likely continuation, so
    drafts are accepted often and the multi-row path is exercised."""
    params = SamplingParams(temperature=1.0, top_k=3, max_tokens=3, ignore_eos=True)
    n = 1500
    off = llm(folder, None, max_num_seqs=8)
    greedy = off.generate([REPEAT[:24]], SamplingParams(temperature=0, max_tokens=3))[0]
    base = _pairs(off, n, params)
    on = llm(folder, spec_all(num_speculative_tokens=2), max_num_seqs=8)
    likely = greedy.token_ids

    def drafter(tokens: list[int], k: int) -> list[int]:
        done = len(tokens) - 24  # output tokens so far
        return likely[done : done + k]

    sched = on.engine.scheduler
    sched.speculation = Speculation(sched.speculation.config, drafter)
    sched.step_time = FixedTime((0.02, 1e-3, 0.0, 0.0, 0.0, 0.0))  # drafts free: always sent
    got = _pairs(on, n, params)
    c = sched.speculation.counts
    assert sum(c.accepted) > n // 8, c  # the second token often came from a verification row
    cats = set(base) | set(got)
    big = [k for k in cats if base[k] + got[k] >= 10]
    small = sum(base[k] for k in cats if k not in big), sum(got[k] for k in cats if k not in big)
    stat = sum((base[k] - got[k]) ** 2 / (base[k] + got[k]) for k in big)
    if sum(small):
        stat += (small[0] - small[1]) ** 2 / sum(small)
    df = len(big) - (0 if sum(small) else 1)
    assert df >= 3
    assert stat < _chi2_quantile(df), (stat, df, base.most_common(5), got.most_common(5))
