"""Issue 15's sampler features through the whole engine on the embedded model: prompt logprobs
(whole, chunked, against transformers), scoring requests (max_tokens 0), and requests with a
grammar or penalties keeping their tokens across batching and preemption (recompute and swap
restore the matchers and the token counts)."""

import json

import pytest
import torch

from tierserve.chat.prompt import ChatPrompter
from tierserve.grammar import GrammarSpec
from tierserve.priority import Priority
from tierserve.sampling_params import SamplingParams

pytestmark = pytest.mark.model

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 24},
        "sky": {"enum": ["clear", "cloudy", "rain"]},
        "days": {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 31},
                 "maxItems": 4},
    },
    "required": ["city", "sky", "days"],
    "additionalProperties": False,
}  # fmt: skip


@pytest.fixture(scope="module")
def llm():
    from tierserve import LLM

    return LLM(
        kv_cache_gib=0.25,
        max_num_batched_tokens=2048,
        activations="float32",
        kv_cache_dtype="float32",
    )


def chat(llm, text: str) -> list[int]:
    p = ChatPrompter(llm.tokenizer)
    return p.encode(p.render([{"role": "user", "content": text}]))


def test_prompt_logprobs_whole_chunked_and_against_transformers(llm):
    from tierserve import LLM
    from tierserve.bench.engine_bench import build_hf
    from tierserve.model.loader import load_model

    ids = chat(llm, "Score this sentence: the quick brown fox jumps over the lazy dog.")
    sp = SamplingParams(max_tokens=0, prompt_logprobs=2)
    whole = llm.generate(ids, sp)[0]
    assert whole.token_ids == [] and whole.finish_reason == "length"
    assert len(whole.prompt_logprobs) == len(ids) - 1
    assert not llm.engine.has_unfinished()
    assert llm.engine.scheduler.kv.check_invariants() is None
    chunked = LLM(
        kv_cache_gib=0.05,
        max_num_batched_tokens=16,
        activations="float32",
        kv_cache_dtype="float32",
    )
    chunked = chunked.generate(ids, sp)[0]
    a = [lp for lp, _ in whole.prompt_logprobs]
    b = [lp for lp, _ in chunked.prompt_logprobs]
    assert b == pytest.approx(a, abs=1e-4)
    loaded = load_model()
    hf = build_hf(loaded.config, loaded.state_dict())
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    want = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()
    assert a == pytest.approx(want, abs=1e-3)
    for pos, (_, (top_ids, top_lps)) in enumerate(whole.prompt_logprobs):
        assert list(top_ids) == ref[pos].topk(2).indices.tolist()
        assert list(top_lps) == pytest.approx(ref[pos].topk(2).values.tolist(), abs=1e-3)


def test_a_scoring_request_next_to_generating_ones(llm):
    ids = chat(llm, "Name a colour.")
    outs = llm.generate(
        [ids, ids, ids],
        [
            SamplingParams(temperature=0, max_tokens=8),
            SamplingParams(max_tokens=0, prompt_logprobs=0),
            SamplingParams(temperature=0, max_tokens=8, top_logprobs=3),
        ],
    )
    assert outs[0].token_ids == outs[2].token_ids and len(outs[0].token_ids) > 0
    assert outs[1].token_ids == [] and len(outs[1].prompt_logprobs) == len(ids) - 1
    assert all(top is None for _, top in outs[1].prompt_logprobs)
    assert len(outs[2].top_logprobs) == len(outs[2].token_ids)
    tops = zip(outs[2].top_logprobs, outs[2].token_ids, strict=True)
    assert all(ids_[0] == t for (ids_, _), t in tops)


def test_structured_output_validates_against_the_schema(llm):
    jsonschema = pytest.importorskip("jsonschema")
    ids = chat(llm, "Describe the weather in a city as JSON.")
    for sp in (
        SamplingParams(temperature=0, max_tokens=120, grammar=GrammarSpec.json_schema(SCHEMA)),
        SamplingParams(temperature=1.0, seed=7, max_tokens=120,
                       grammar=GrammarSpec.json_schema(SCHEMA)),
    ):  # fmt: skip
        out = llm.generate(ids, sp)[0]
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), SCHEMA)


def run_preempting(first, late, after_steps: int, **engine_args) -> list:
    """Run `first` (P3 requests) for `after_steps` steps, then add `late` (P0 requests): they
    preempt the P3 ones mid-generation. The engine's clock stands still, so the schedule depends
    on nothing but the tokens. Returns the requests, finished."""
    from tierserve.clock import ManualClock
    from tierserve.engine.args import EngineArgs
    from tierserve.engine.builder import build_engine
    from tierserve.request import Request

    args = EngineArgs(
        measure_costs=False, activations="float32", kv_cache_dtype="float32", **engine_args
    )  # as `llm`
    eng = build_engine(args, ManualClock()).engine
    reqs = []
    for prio, batch in ((Priority.P3, first), (Priority.P0, late)):
        for p, sp in batch:
            reqs.append(Request(f"s{len(reqs)}", p, sp, priority=prio, eos_token_id=2))
            eng.add_request(reqs[-1])
        for _ in range(after_steps if prio == Priority.P3 else 0):
            eng.step()
    while eng.has_unfinished():
        eng.step()
    return reqs


def test_grammar_and_penalty_requests_keep_their_tokens_across_batches_and_preemption(llm):
    topics = ["rain", "a cat", "chess", "bread", "a violin", "salt"]
    prompts = [chat(llm, f"Describe {t} in JSON with a city, the sky and some days.")
               for t in topics]  # fmt: skip
    special = [
        SamplingParams(temperature=0.8, seed=3, max_tokens=60,
                       grammar=GrammarSpec.json_schema(SCHEMA), frequency_penalty=0.5),
        SamplingParams(temperature=0, max_tokens=40, repetition_penalty=1.4,
                       presence_penalty=0.5, logit_bias={28: 2.0}),
    ]  # fmt: skip
    plain = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    alone = [llm.generate(prompts[i], sp)[0].token_ids for i, sp in enumerate(special)]
    batch = llm.generate(prompts, special + [plain] * 4)
    assert [o.token_ids for o in batch[:2]] == alone
    for mode in ("recompute", "swap"):
        reqs = run_preempting(
            list(zip(prompts[:2], special, strict=True)),
            [(p, plain) for p in prompts[2:]],
            after_steps=6,
            num_kv_blocks=10,
            swap_space_gib=0.05,
            preemption_mode=mode,
            enable_prefix_caching=False,
        )
        assert all(r.num_preemptions for r in reqs[:2]), f"not both preempted ({mode})"
        assert [r.output_token_ids for r in reqs[:2]] == alone, mode
        assert [r.output_token_ids for r in reqs[2:]] == [o.token_ids for o in batch[2:]], mode
