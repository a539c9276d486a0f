"""The draft-model drafter (`--speculative-model`) on tiny random Llamas (transformers'
from_config; nothing downloaded): the target drafting for itself is accepted almost always and
changes no token; another random model drafting is accepted less and still changes no token;
the drafter's per-request state leaves with its request (finished, aborted, preempted) and its
pool is bounded; a bad draft model fails at start naming the problem; and drafts cross the
engine thread through the HTTP server."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server_utils import running_server
from tests.test_architectures import save_tiny
from tests.test_spec_core import MEMORY_BOUND, FixedTime
from tests.test_spec_model import prompts
from tierserve import LLM
from tierserve.core.speculation import SpecConfig, Speculation, parse_speculative_config
from tierserve.engine.args import EngineArgs
from tierserve.engine.builder import build_engine
from tierserve.executor.draft_loader import BadDraftModel
from tierserve.executor.draft_model import DraftModel
from tierserve.priority import Priority
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("draft-target")
    save_tiny(path, "LlamaForCausalLM", seed=3)
    return path


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    """Same shape and tokenizer, other random weights: a poor drafter."""
    path = tmp_path_factory.mktemp("draft-other")
    save_tiny(path, "LlamaForCausalLM", seed=11)
    return path


def spec_all(**kw) -> SpecConfig:
    return SpecConfig(classes=(0, 1, 2, 3), prior_acceptance=0.9, num_speculative_tokens=4, **kw)


def llm(target, draft=None, **kw) -> LLM:
    spec = spec_all() if draft is not None else None
    out = LLM(
        model=str(target),
        speculative_config=spec,
        speculative_model=str(draft) if draft is not None else None,
        activations="float32",
        **kw,
    )
    out.engine.scheduler.step_time = FixedTime(MEMORY_BOUND)  # drafts pay: test what they do
    if draft is not None:  # and never priced out by a draft pass timed on a busy host
        out.engine.scheduler.speculation.draft_pass_s = lambda: 0.0
    return out


def acceptance(engine_llm: LLM) -> tuple[int, float]:
    c = engine_llm.engine.scheduler.speculation.counts
    return sum(c.drafted), sum(c.accepted) / max(1, sum(c.drafted))


@pytest.fixture(scope="module")
def plain(target):
    return [o.token_ids for o in llm(target).generate(prompts(6), GREEDY)]


def test_the_target_drafting_for_itself_is_exact_and_almost_always_accepted(target, plain):
    fast = llm(target, target)
    got = [o.token_ids for o in fast.generate(prompts(6), GREEDY)]
    drafted, rate = acceptance(fast)
    assert got == plain
    assert drafted > 50 and rate > 0.9, (drafted, rate)
    fast.engine.step()  # the step after the last finish tells the executor to forget them
    assert fast.engine.executor.drafter.states == {}


def test_another_model_drafting_is_accepted_less_and_changes_no_token(target, other, plain):
    fast = llm(target, other)
    got = [o.token_ids for o in fast.generate(prompts(6), GREEDY)]
    drafted, rate = acceptance(fast)
    assert got == plain
    assert drafted > 0 and rate < 0.8, (drafted, rate)


def test_sampled_outputs_with_a_seed_are_unchanged(target, other):
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=20, ignore_eos=True)
    want = [o.token_ids for o in llm(target).generate(prompts(3), params)]
    fast = llm(target, other)
    assert [o.token_ids for o in fast.generate(prompts(3), params)] == want
    assert acceptance(fast)[0] > 0


def test_an_aborted_request_leaves_the_drafter_mid_speculation(target):
    fast = llm(target, target)
    eng, drafter = fast.engine, fast.engine.executor.drafter
    for i, p in enumerate(prompts(3)):
        eng.add_request(Request(f"r{i}", p, GREEDY, arrival_time=eng.clock.now()))
    for _ in range(4):  # every request drafts in its first decodes
        eng.step()
    assert set(drafter.states) == {"r0", "r1", "r2"}
    eng.abort_request("r1")
    eng.step()
    assert set(drafter.states) == {"r0", "r2"}
    while eng.has_unfinished():
        eng.step()
    eng.step()
    assert drafter.states == {} and drafter.free_blocks == drafter.num_blocks


def test_preempted_requests_leave_the_drafter_and_outputs_stay_exact(target, plain):
    # 10 KV blocks of 16 tokens for six requests of ~56 tokens: preemptions all along
    fast = llm(target, target, num_kv_blocks=10, max_num_seqs=6)
    eng, drafter = fast.engine, fast.engine.executor.drafter
    reqs = [Request(f"r{i}", p, GREEDY, arrival_time=0.0) for i, p in enumerate(prompts(6))]
    for r in reqs:
        eng.add_request(r)
    while eng.has_unfinished():
        eng.step()
        # the drafter holds state only for requests the executor holds (not the preempted)
        assert set(drafter.states) <= set(eng.executor.states)
    counts = eng.scheduler.preemptions
    assert counts.swap + counts.recompute > 0
    assert acceptance(fast)[0] > 0
    assert [list(r.output_token_ids) for r in reqs] == plain


def test_a_small_pool_evicts_an_idle_requests_state_and_stays_exact(target, plain):
    """P2 drafts while alone; a P0 arrives, so P2 stops drafting (it no longer runs alone) and
    P0's drafts need the pool: the idle P2's state is evicted."""
    fast = llm(target, target)
    sched, ex = fast.engine.scheduler, fast.engine.executor
    spec = SpecConfig("draft_model", str(target), classes=(0,), prior_acceptance=0.9)
    sched.speculation = Speculation(spec)
    # 6 blocks of 16 tokens: one request's 81 tokens (and 3 drafts) fit, two ~60 do not
    ex.drafter = drafter = DraftModel(ex.drafter.model, 6, ex.drafter.block_size)
    eng = fast.engine
    low = Request("low", prompts(2)[0], GREEDY, priority=Priority.P2, arrival_time=0.0)
    eng.add_request(low)
    while "low" not in drafter.states:
        assert low.num_output_tokens < 4, "P2 alone never drafted"
        eng.step()
    high = Request("high", prompts(2)[1], GREEDY, priority=Priority.P0, arrival_time=0.0)
    eng.add_request(high)
    while "high" not in drafter.states:
        assert high.num_output_tokens < 4, "P0 never drafted"
        eng.step()
    assert drafter.evictions == 1 and set(drafter.states) == {"high"}
    while eng.has_unfinished():
        eng.step()
    assert [list(low.output_token_ids), list(high.output_token_ids)] == plain[:2]
    held = sum(len(s.block_ids) for s in drafter.states.values())
    assert drafter.free_blocks + held == 6  # no block lost


def test_a_draft_model_with_a_shorter_context_drafts_within_it(target, tmp_path, plain):
    save_tiny(tmp_path, "LlamaForCausalLM", seed=3, max_position_embeddings=64)
    fast = llm(target, tmp_path)
    got = [o.token_ids for o in fast.generate(prompts(6), GREEDY)]
    assert got == plain
    _, rate = acceptance(fast)
    # the same weights: accepted while within its 64 tokens, filler drafts (rejected) past them
    assert 0.1 < rate < 0.9, rate


# -- bad input at start ------------------------------------------------------------------------
def test_a_missing_draft_model_fails_at_start(target, tmp_path):
    with pytest.raises(BadDraftModel, match="no such file or folder"):
        llm(target, tmp_path / "nope.gguf")


def test_a_draft_model_with_another_tokenizer_fails_at_start(target, tmp_path):
    save_tiny(tmp_path, "LlamaForCausalLM", seed=4)
    tok = json.loads((tmp_path / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["w5"], vocab["w6"] = vocab["w6"], vocab["w5"]  # two ids swapped
    (tmp_path / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(BadDraftModel, match="tokenizer differs"):
        llm(target, tmp_path)


def test_a_draft_model_with_another_vocabulary_size_fails_at_start(target, tmp_path):
    save_tiny(tmp_path, "LlamaForCausalLM", seed=4, vocab_size=300)
    with pytest.raises(BadDraftModel, match="vocabulary has 300 tokens"):
        llm(target, tmp_path)


def test_a_draft_model_the_loader_cannot_read_fails_at_start(target, tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(BadDraftModel, match="cannot be loaded as a model"):
        llm(target, junk)
    (tmp_path / "folder").mkdir()
    with pytest.raises(BadDraftModel, match="cannot be loaded as a model"):
        llm(target, tmp_path / "folder")


def test_the_config_takes_vllms_keys_and_the_flag():
    spec = parse_speculative_config(
        '{"method": "draft_model", "model": "/m", "num_speculative_tokens": 3}'
    )
    assert (spec.method, spec.model, spec.num_speculative_tokens) == ("draft_model", "/m", 3)
    assert parse_speculative_config('{"model": "/m"}').method == "draft_model"  # as vLLM infers
    with pytest.raises(ValueError, match="needs 'model'"):
        parse_speculative_config('{"method": "draft_model"}')
    args = EngineArgs(
        speculative_model="/m", speculative_config=SpecConfig(num_speculative_tokens=2)
    )
    assert (args.speculative_config.method, args.speculative_config.model) == ("draft_model", "/m")
    assert args.speculative_config.num_speculative_tokens == 2
    with pytest.raises(ValueError, match="differ"):
        EngineArgs(speculative_model="/a", speculative_config=SpecConfig("draft_model", "/b"))


# -- through the engine thread -----------------------------------------------------------------
def test_drafts_cross_the_engine_thread_through_the_server(target):
    built = build_engine(
        EngineArgs(
            model=str(target),
            speculative_model=str(target),
            speculative_config=spec_all(),
            activations="float32",
            measure_costs=False,
        )
    )
    built.engine.scheduler.step_time = FixedTime(MEMORY_BOUND)
    body = {"prompt": " ".join(f"w{t}" for t in prompts(1)[0]), "max_tokens": 24}
    body |= {"priority": 0, "ignore_eos": True, "temperature": 0}
    with running_server(built) as (url, _):
        on = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()
        off = httpx.post(
            f"{url}/v1/completions", json=body | {"speculative": False}, timeout=60
        ).json()
    details = on["usage"]["completion_tokens_details"]
    assert details["accepted_prediction_tokens"] > 10 * max(
        1, details["rejected_prediction_tokens"]
    )
    assert on["choices"][0]["text"] == off["choices"][0]["text"]
    assert "completion_tokens_details" not in off["usage"]
    built.engine.step()
    assert built.executor.drafter.states == {}
