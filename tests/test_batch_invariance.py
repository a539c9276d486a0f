"""Same request, same answer (issue 41): with the default settings a request's greedy tokens
and their logprobs are the bits it gets served alone, whatever shares its steps, however its
prompt is chunked, whether its prefix came from the cache, whether it was preempted (recompute
or swap) and whether its tokens were verified as drafts.

Tiny random models of three architectures (the fused layer: Llama; the op-by-op kernel path:
Qwen3 with q/k norms, Phi-3 with partial rotary) under random mixes (hypothesis), forced
preemption and speculation; the embedded model (q4_1 weights, the CPU's default products)
through the engine and through a real `tierserve serve` with the issue's three requests."""

from __future__ import annotations

import random

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.test_architectures import VOCAB, save_tiny
from tierserve import LLM
from tierserve.core.speculation import SpecConfig
from tierserve.priority import Priority
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams

NEW = 10
ARCHS = ("LlamaForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM")
GREEDY = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)


def prompts(seed: int, n: int = 8) -> list[list[int]]:
    """Prompts sharing prefixes (none, one block, two blocks and a token): cache hits."""
    rng = random.Random(seed)
    shared = [rng.randrange(2, VOCAB) for _ in range(33)]
    out = []
    for i in range(n):
        keep = (0, 16, 33, 33)[i % 4]
        tail = [rng.randrange(2, VOCAB) for _ in range(rng.randrange(3, 40))]
        out.append(shared[:keep] + tail)
    return out


def serve(llm: LLM, ids: list[list[int]], arrivals: list[int], prios: list[int]):
    """Each prompt added at its step (not all at once), served to the end; per prompt its
    (tokens, logprobs) and how often it was preempted."""
    reqs = [
        Request(f"r{i}", p, GREEDY, priority=Priority(prios[i]), arrival_time=0.0)
        for i, p in enumerate(ids)
    ]
    step, added = 0, 0
    order = sorted(range(len(reqs)), key=lambda i: arrivals[i])
    while added < len(reqs) or llm.engine.has_unfinished():
        while added < len(reqs) and arrivals[order[added]] <= step:
            llm.engine.add_request(reqs[order[added]])
            added += 1
        llm.engine.step()
        step += 1
        assert step < 5000
    return [(list(r.output_token_ids), list(r.output_logprobs), r.num_preemptions) for r in reqs]


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    save_tiny(folder, request.param, seed=3, initializer_range=0.05)  # flat logits: near-ties
    alone_llm = LLM(model=str(folder), num_kv_blocks=64, measure_costs=False)
    expect = {}
    for seed in range(3):
        for p in prompts(seed):
            out = alone_llm.generate([p], GREEDY)[0]
            expect[tuple(p)] = (out.token_ids, out.logprobs)
    return request.param, folder, expect


def check(results, ids, expect):
    for p, (tokens, lps, _) in zip(ids, results, strict=True):
        want_tokens, want_lps = expect[tuple(p)]
        assert tokens == want_tokens
        assert lps == want_lps  # the same bits, not just close


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_random_mixes_give_each_request_its_answer_alone(tiny, data):
    _, folder, expect = tiny
    seed = data.draw(st.integers(0, 2), label="prompt set")
    pool = prompts(seed)
    n = data.draw(st.integers(2, 6), label="requests")
    ids = [pool[data.draw(st.integers(0, len(pool) - 1))] for _ in range(n)]  # repeats: hits
    arrivals = data.draw(st.lists(st.integers(0, 6), min_size=n, max_size=n), label="arrivals")
    prios = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n), label="classes")
    chunk = data.draw(st.sampled_from([16, 24, 40, 512]), label="max_num_batched_tokens")
    blocks = data.draw(st.sampled_from([10, 14, 64]), label="kv blocks")  # 10, 14: preemption
    mode = data.draw(st.sampled_from(["recompute", "swap"]), label="preemption")
    spec = data.draw(st.booleans(), label="speculation")
    llm = LLM(
        model=str(folder),
        num_kv_blocks=blocks,
        max_num_batched_tokens=chunk,
        preemption_mode=mode,
        swap_space_gib=0.01 if mode == "swap" else 0.0,
        speculative_config=SpecConfig(classes=(0, 1, 2, 3), prompt_lookup_min=1) if spec else None,
        measure_costs=False,
    )
    check(serve(llm, ids, arrivals, prios), ids, expect)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preempted_requests_give_their_answers_alone(tiny, mode):
    _, folder, expect = tiny
    ids = prompts(1)[:6]
    llm = LLM(
        model=str(folder),
        num_kv_blocks=9,
        max_num_batched_tokens=24,
        preemption_mode=mode,
        swap_space_gib=0.01 if mode == "swap" else 0.0,
        measure_costs=False,
    )
    res = serve(llm, ids, [0, 0, 0, 1, 2, 2], [3, 3, 2, 1, 0, 0])
    assert sum(pre for *_, pre in res) > 0  # the case really preempts
    check(res, ids, expect)


def test_tokens_verified_as_drafts_are_the_tokens_decoded_alone(tiny):
    _, folder, expect = tiny
    ids = prompts(2)[:4]
    spec = SpecConfig(classes=(0, 1, 2, 3), prompt_lookup_min=1, prior_acceptance=0.9)
    llm = LLM(model=str(folder), num_kv_blocks=64, speculative_config=spec, measure_costs=False)
    res = serve(llm, ids, [0, 0, 1, 1], [0, 1, 1, 2])
    assert sum(llm.engine.scheduler.speculation.counts.drafted) > 0  # drafts were verified
    check(res, ids, expect)


@pytest.mark.model
def test_the_embedded_model_answers_alike_fresh_cached_batched_and_chunked():
    """The issue's example on the engine: the first request prefills its whole prompt, the next
    ones hit the prefix cache, one shares its steps with six others, one is chunked by 8;
    greedy, and sampled with a seed."""
    msg = [{"role": "user", "content": "Write one sentence about the sea."}]
    others = [[{"role": "user", "content": f"Tell me about topic {i}, please."}] for i in range(6)]
    llm = LLM()  # the defaults: the embedded model, its q4_1 weights, this CPU's products
    chunky = LLM(max_num_batched_tokens=8)
    # greedy, and sampled with a seed (the others in the batch sample with seeds of their own)
    for sp in (SamplingParams(temperature=0, max_tokens=24),
               SamplingParams(temperature=0.9, seed=7, max_tokens=24)):  # fmt: skip
        mates = [SamplingParams(temperature=0.9, seed=i, max_tokens=24) for i in range(6)]
        first = llm.generate([msg], sp)[0]
        again = [llm.generate([msg], sp)[0], llm.generate([*others, msg], [*mates, sp])[-1]]
        for out in (*again, chunky.generate([msg], sp)[0]):
            assert out.token_ids == first.token_ids
            assert out.logprobs == first.logprobs


@pytest.mark.model
def test_three_identical_requests_to_a_default_server_get_one_answer(tmp_path):
    from tierserve.loadgen.server import start_server, stop_server

    body = {
        "messages": [{"role": "user", "content": "Write one sentence about the sea."}],
        "max_tokens": 24,
        "temperature": 0,
        "logprobs": True,
    }
    proc, url = start_server(["--kv-cache-gib", "0.1"], log=tmp_path / "serve.log", timeout_s=180)
    try:
        answers = []
        for _ in range(3):
            r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
            choice = r.json()["choices"][0]
            lps = [t["logprob"] for t in choice["logprobs"]["content"]]
            answers.append((choice["message"]["content"], lps))
    finally:
        stop_server(proc)
    assert answers[0] == answers[1] == answers[2]
