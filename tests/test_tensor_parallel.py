"""Tensor parallelism on the CPU (issue 44): two processes over gloo, tiny random models.

* the split itself: each rank's part of every weight kind, put back together, is the weight;
  a count that does not divide is refused naming it;
* TP=2 against TP=1 on the same weights, for Llama (fused at TP=1), Qwen2 (biases, a window),
  Gemma2 (sandwich norms, soft-caps, tied embeddings) and Phi-3 (fused checkpoint projections,
  partial rotary): greedy tokens equal, logprobs within float32 rounding;
* preemption (recompute and swap), prefix-cache hits, speculation and a P0 cut-in between two
  layers under TP=2 give TP=1's tokens;
* through a real `tierserve serve -tp 2`: answers as TP=1; a killed worker ends the open stream
  with an error event and [DONE], /health turns 503 and the server exits non-zero; a model that
  does not split is one line and status 2."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
import torch

from tests.test_architectures import save_tiny
from tests.test_batch_invariance import prompts, serve
from tierserve import LLM
from tierserve.core.speculation import SpecConfig
from tierserve.executor import shm_comm
from tierserve.executor.base import ExecutorLost
from tierserve.model import quant
from tierserve.model.config import ModelConfig
from tierserve.model.sharding import ShardedWeights, ShardingError, shard_config
from tierserve.sampling_params import SamplingParams

NEW = 10
GREEDY = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
ARCHS = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Gemma2ForCausalLM", "Phi3ForCausalLM")
TOL = 1e-4  # logprobs: two partial sums per projection instead of one


def _config(**kw) -> ModelConfig:
    base = dict(
        architecture="LlamaForCausalLM", vocab_size=250, hidden_size=64, intermediate_size=96,
        num_layers=1, num_heads=4, num_kv_heads=2, head_dim=16,
    )  # fmt: skip
    return ModelConfig(**(base | kw))


# -- the split ------------------------------------------------------------------------------
def test_each_ranks_part_of_every_weight_kind_puts_the_weight_back_together():
    c = _config()
    g = torch.Generator().manual_seed(0)
    w = {
        "model.layers.0.self_attn.q_proj.weight": torch.randn(64, 64, generator=g),
        "model.layers.0.self_attn.k_proj.bias": torch.randn(32, generator=g),
        "model.layers.0.self_attn.o_proj.weight": torch.randn(64, 64, generator=g),
        "model.layers.0.self_attn.o_proj.bias": torch.randn(64, generator=g),
        "model.layers.0.mlp.down_proj.weight": torch.randn(64, 96, generator=g),
        "model.layers.0.self_attn.qkv_proj.weight": torch.randn(128, 64, generator=g),
        "model.layers.0.mlp.gate_up_proj.weight": torch.randn(192, 64, generator=g),
        "model.embed_tokens.weight": torch.randn(250, 64, generator=g),  # 250 = 2 x 125
        "model.layers.0.input_layernorm.weight": torch.randn(64, generator=g),
    }
    parts = [ShardedWeights(dict(w), c, r, 2) for r in range(2)]
    take = {k: [p.pop(k) if k in p else None for p in parts] for k in w}
    cat0 = lambda k: torch.cat(take[k])  # noqa: E731
    assert torch.equal(cat0("model.layers.0.self_attn.q_proj.weight"), w[next(iter(w))])
    assert torch.equal(cat0("model.layers.0.self_attn.k_proj.bias"), w[list(w)[1]])
    o = take["model.layers.0.self_attn.o_proj.weight"]
    assert o[0].shape == (64, 32) and torch.equal(torch.cat(o, 1), w[list(w)[2]])
    b = take["model.layers.0.self_attn.o_proj.bias"]  # added once, by rank 0
    assert torch.equal(b[0], w[list(w)[3]]) and b[1] is None
    assert torch.equal(torch.cat(take["model.layers.0.mlp.down_proj.weight"], 1), w[list(w)[4]])
    # fused q/k/v: each rank holds its q heads, then its k heads, then its v heads
    qkv, full = take["model.layers.0.self_attn.qkv_proj.weight"], w[list(w)[5]]
    q, k, v = full[:64], full[64:96], full[96:]
    assert torch.equal(qkv[1], torch.cat([q[32:], k[16:], v[16:]]))
    gu, full = take["model.layers.0.mlp.gate_up_proj.weight"], w[list(w)[6]]
    assert torch.equal(gu[0], torch.cat([full[:48], full[96:144]]))
    emb = take["model.embed_tokens.weight"]
    assert torch.equal(torch.cat(emb), w["model.embed_tokens.weight"])
    norm = take["model.layers.0.input_layernorm.weight"]
    assert torch.equal(norm[0], norm[1])


def test_an_uneven_vocabulary_is_padded_and_gguf_blocks_are_cut_whole():
    c = _config(vocab_size=251)
    emb = torch.randn(251, 64)
    parts = [ShardedWeights({"model.embed_tokens.weight": emb}, c, r, 2) for r in range(2)]
    a, b = (p.pop("model.embed_tokens.weight") for p in parts)
    assert a.shape == b.shape == (126, 64) and torch.equal(b[-1], torch.zeros(64))
    assert torch.equal(torch.cat([a, b])[:251], emb)
    w = torch.randn(64, 128)  # o_proj of 8 heads of 16: 64 input columns per rank, 2 blocks
    qt = quant.quantize(w, "q8_0")
    halves = [
        ShardedWeights({"l.self_attn.o_proj.weight": qt}, c, r, 2).pop("l.self_attn.o_proj.weight")
        for r in range(2)
    ]
    assert all(isinstance(h, quant.QuantTensor) and h.shape == (64, 64) for h in halves)
    whole = torch.cat([quant.dequantize(h) for h in halves], 1)
    assert torch.equal(whole, quant.dequantize(qt))


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        (dict(num_heads=6, num_kv_heads=3), "3 KV heads do not divide by 2"),
        (dict(num_heads=3, num_kv_heads=1), "3 attention heads do not divide by 2"),
        (dict(intermediate_size=95), "95 MLP width"),
    ],
)
def test_a_count_that_does_not_divide_is_refused_naming_it(kw, named):
    with pytest.raises(ShardingError, match=named):
        shard_config(_config(**kw), 2)
    assert shard_config(_config(), 2).num_heads == 2


# -- the CPU's shared-memory collectives, across two processes ------------------------------
SLOT = 4096  # bytes: small, so that messages go in pieces


def _shm_rank(rank: int, path: str, out) -> None:
    torch.manual_seed(rank)
    comm = shm_comm.ShmComm(path, rank, 2, timeout_s=20, slot_bytes=SLOT)
    x = torch.arange(3000, dtype=torch.float32) * (rank + 1)  # 12 kB: three pieces
    comm.all_reduce(x)
    y = torch.randn(37, 11)  # a random part per rank; 37 rows over 4 kB slots
    parts = comm.all_gather_rows(y)
    tokens = comm.broadcast(torch.tensor([5, 7, 9]) if rank == 0 else torch.zeros(3).long())
    out.put((rank, x.numpy(), y.numpy(), [p.numpy() for p in parts], tokens.tolist()))
    if rank == 1:
        return  # silent from now on: rank 0's next collective times out
    comm.timeout_s = 1.0
    try:
        comm.all_reduce(torch.ones(4))
    except RuntimeError as exc:
        out.put((rank, str(exc)))


def test_shared_memory_collectives_sum_gather_and_broadcast_across_processes(tmp_path):
    import multiprocessing as mp

    path = shm_comm.create(2, slot_bytes=SLOT)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_shm_rank, args=(r, path, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = [out.get(timeout=60) for _ in range(3)]
    for p in procs:
        p.join(30)
    os.unlink(path)
    by_rank = {g[0]: g for g in got if len(g) == 5}
    timed_out = next(g[1] for g in got if len(g) == 2)
    want = np.arange(3000, dtype=np.float32) * 3
    for r in (0, 1):
        _, x, _, parts, tokens = by_rank[r]
        assert np.array_equal(x, want) and tokens == [5, 7, 9]
        assert all(np.array_equal(parts[q], by_rank[q][2]) for q in (0, 1))
    assert "timed out after 1 s waiting for rank(s) [1]" in timed_out


def test_gloo_serves_where_shared_memory_is_off(llama, monkeypatch):
    folder, expect = llama
    monkeypatch.setenv("TIERSERVE_TP_SHM", "off")
    ids = prompts(0)[:3]
    kw = dict(num_kv_blocks=64, measure_costs=False, tensor_parallel_size=2)
    with LLM(model=str(folder), **kw) as llm:
        assert llm.executor.tp.shm is None
        check([(o.token_ids, o.logprobs) for o in llm.generate(ids, GREEDY)], ids, expect)


# -- TP=2 against TP=1 ----------------------------------------------------------------------
def _tiny(arch: str, tmp_path_factory):
    folder = tmp_path_factory.mktemp(arch)
    save_tiny(folder, arch, seed=5)
    ids = prompts(0) + prompts(1)[:6]
    with LLM(model=str(folder), num_kv_blocks=64, measure_costs=False) as one:
        outs = one.generate(ids, GREEDY)
    expect = {tuple(p): (o.token_ids, o.logprobs) for p, o in zip(ids, outs, strict=True)}
    return folder, expect


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory):
    return _tiny(request.param, tmp_path_factory)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """One architecture is enough for the scheduler's side, the protocol and the server."""
    return _tiny("LlamaForCausalLM", tmp_path_factory)


def check(got: list[tuple[list[int], list[float]]], ids, expect) -> None:
    for p, (tokens, lps) in zip(ids, got, strict=True):
        want_tokens, want_lps = expect[tuple(p)]
        assert tokens == want_tokens
        np.testing.assert_allclose(lps, want_lps, atol=TOL, rtol=0)


def test_two_ranks_give_one_ranks_tokens_and_logprobs(tiny):
    folder, expect = tiny
    ids = prompts(0)
    with LLM(
        model=str(folder), num_kv_blocks=64, measure_costs=False, tensor_parallel_size=2
    ) as llm:
        assert llm.executor.tp.size == 2 and llm.executor.model.config.num_heads == 2
        check([(o.token_ids, o.logprobs) for o in llm.generate(ids, GREEDY)], ids, expect)
        # again: the requests now hit the prefix cache
        check([(o.token_ids, o.logprobs) for o in llm.generate(ids, GREEDY)], ids, expect)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_prefix_hits_and_drafts_under_two_ranks_give_one_ranks_tokens(llama, mode):
    folder, expect = llama
    ids = prompts(1)[:6]
    spec = SpecConfig(classes=(0, 1, 2, 3), prompt_lookup_min=1, prior_acceptance=0.9)
    with LLM(
        model=str(folder),
        num_kv_blocks=9,
        max_num_batched_tokens=24,
        preemption_mode=mode,
        swap_space_gib=0.01 if mode == "swap" else 0.0,
        speculative_config=spec,
        measure_costs=False,
        tensor_parallel_size=2,
    ) as llm:
        res = serve(llm, ids, [0, 0, 0, 1, 2, 2], [3, 3, 2, 1, 0, 0])
        assert sum(pre for *_, pre in res) > 0  # the case really preempts
        check([(t, lp) for t, lp, _ in res], ids, expect)


def test_a_draft_models_drafts_reach_every_rank(llama):
    """The drafter runs on rank 0 only; its drafts travel in the step's message."""
    folder, expect = llama
    ids = prompts(0)[:4]
    from tierserve.core.speculation import Speculation

    spec = SpecConfig(
        classes=(0, 1, 2, 3), method="draft_model", model=str(folder), num_speculative_tokens=3,
        prior_acceptance=0.9,
    )  # fmt: skip
    kw = dict(num_kv_blocks=64, measure_costs=False, tensor_parallel_size=2)
    with LLM(model=str(folder), speculative_config=spec, **kw) as llm:
        # the drafter's measured pass time left out of the goodput rule: drafts always pay (the
        # draft is the target itself here, as costly as a step on a busy machine)
        llm.engine.scheduler.speculation = Speculation(spec)
        got = llm.generate(ids, GREEDY)
        assert sum(llm.engine.scheduler.speculation.counts.drafted) > 0
    check([(o.token_ids, o.logprobs) for o in got], ids, expect)


def test_a_p0_cut_in_between_two_layers_runs_on_every_rank(llama):
    """The hook runs a whole step inside a step in flight: the worker runs it at the same
    layer boundary (the `cont` protocol), and every request still gets its TP=1 tokens."""
    folder, expect = llama
    from tierserve.priority import Priority
    from tierserve.request import Request

    ids = prompts(0)[:4]
    with LLM(
        model=str(folder),
        num_kv_blocks=64,
        measure_costs=False,
        tensor_parallel_size=2,
        p0_cut_in=True,
        p0_express="exclusive",
    ) as llm:
        core = llm.engine
        early = [
            Request(f"e{i}", p, GREEDY, priority=Priority.P3, arrival_time=0.0)
            for i, p in enumerate(ids[:3])
        ]
        late = Request("late", ids[3], GREEDY, priority=Priority.P0, arrival_time=0.0)
        for r in early:
            core.add_request(r)
        while not all(r.num_output_tokens for r in early):
            core.step()
        seen = {}

        def hook():
            if not seen:
                core.add_request(late)
                seen["cut_in"] = core.cut_in()

        assert core.set_layer_hook(hook)
        core.step()
        assert seen["cut_in"][1] is not None and late.num_output_tokens == 1
        core.set_layer_hook(None)
        while core.has_unfinished():
            core.step()
        reqs = [*early, late]
        check([(list(r.output_token_ids), list(r.output_logprobs)) for r in reqs], ids, expect)


def test_a_hung_worker_fails_the_step_within_the_timeout(llama, monkeypatch):
    folder, _ = llama
    monkeypatch.setenv("TIERSERVE_TP_TIMEOUT_S", "3")
    llm = LLM(model=str(folder), num_kv_blocks=64, measure_costs=False, tensor_parallel_size=2)
    (pid,) = llm.executor.workers.pids()
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with pytest.raises(ExecutorLost, match="tensor-parallel step failed"):
            llm.generate(prompts(0)[:2], GREEDY)
        assert time.monotonic() - t0 < 20
    finally:
        llm.close()  # kills the stopped worker
    assert not llm.executor.workers.procs[0].is_alive()


# -- through the server ---------------------------------------------------------------------
def _start(folder, port: int, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "tierserve", "serve", "--model", str(folder), "--port", str(port)]
    return subprocess.Popen(
        [*cmd, *extra], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _wait_ready(proc: subprocess.Popen, port: int, lines: list[str]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if "ready in" in line:
            return
        assert line or proc.poll() is None, "".join(lines)
    raise AssertionError("".join(lines))


def test_the_server_with_two_ranks_answers_as_one_and_fails_cleanly_when_a_worker_dies(llama):
    folder, expect = llama
    port = 18000 + os.getpid() % 1000
    proc = _start(folder, port, "-tp", "2")
    lines: list[str] = []
    try:
        _wait_ready(proc, port, lines)
        (pid,) = (int(x) for x in re.search(r"worker pids \[(\d+)\]", "".join(lines)).groups())
        base = f"http://127.0.0.1:{port}"
        p = prompts(0)[0]
        body = {"model": folder.name, "prompt": p, "max_tokens": NEW, "temperature": 0}
        body |= {"ignore_eos": True, "logprobs": 1}
        r = httpx.post(base + "/v1/completions", json=body, timeout=60).json()
        got = r["choices"][0]["logprobs"]["token_logprobs"]
        np.testing.assert_allclose(got, expect[tuple(p)][1], atol=TOL, rtol=0)
        # a stream long enough to be open when the worker dies
        body = {"model": folder.name, "prompt": p, "max_tokens": 200, "stream": True}
        body |= {"ignore_eos": True}
        events: list[str] = []
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as s:
            for line in s.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                if len(events) == 3:
                    os.kill(pid, signal.SIGKILL)
        assert events[-1] == "[DONE]"
        assert "error" in json.loads(events[-2])
        assert len(events) < 200  # it did not run to the end
        health = httpx.get(base + "/health", timeout=10)
        assert health.status_code == 503 and "tensor-parallel worker 1" in health.text
        assert proc.wait(timeout=30) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_model_that_does_not_split_is_one_line_and_status_2(llama):
    folder, _ = llama
    proc = _start(folder, 18999, "-tp", "3")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2
    last = out.strip().splitlines()[-1]
    assert last == (
        "tierserve serve: --tensor-parallel-size 3: the model's 4 attention heads do not "
        "divide by 3"
    )


def test_a_gguf_files_quantized_blocks_split_whole_and_two_ranks_answer_as_one(
    tmp_path, monkeypatch
):
    """A q8_0 GGUF file (Qwen2: q/k/v biases, run by the fused layer's halves): each rank keeps
    its part of every weight in q8_0 (o's and down's inputs cut on whole 32-weight blocks)."""
    from tests.test_architectures import write_gguf

    monkeypatch.setenv("TIERSERVE_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "hf"
    folder.mkdir()
    hf = save_tiny(folder, "Qwen2ForCausalLM", seed=5, use_sliding_window=False,
                   intermediate_size=128)  # fmt: skip
    write_gguf(hf, tmp_path / "tiny.gguf", "qwen2")
    ids = prompts(0)[:4]
    kw = dict(num_kv_blocks=64, measure_costs=False, activations="float32")
    with LLM(model=str(tmp_path / "tiny.gguf"), **kw) as one:
        want = one.generate(ids, GREEDY)
    with LLM(model=str(tmp_path / "tiny.gguf"), tensor_parallel_size=2, **kw) as two:
        layer = two.executor.model.layers[0]
        assert [lin.fmt for lin in (layer.qkv, layer.o, layer.gate_up, layer.down)] == ["q8_0"] * 4
        assert layer.down.in_features == 64 and layer.o.in_features == 32
        got = two.generate(ids, GREEDY)
    for a, b in zip(want, got, strict=True):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(b.logprobs, a.logprobs, atol=TOL, rtol=0)


@pytest.mark.model
def test_the_embedded_model_splits_three_ways_with_grammars_and_penalties_on_rank_0():
    """SmolLM2's q4_1 GGUF (9 heads, 3 KV heads) at TP=3: a JSON-schema request with a
    frequency penalty, whose masks and counts live on rank 0 only, gives TP=1's answer (float32
    products) and validates."""
    jsonschema = pytest.importorskip("jsonschema")
    from tests.test_sampling_engine import SCHEMA, chat
    from tierserve.grammar import GrammarSpec

    sp = SamplingParams(
        temperature=0, max_tokens=120, grammar=GrammarSpec.json_schema(SCHEMA),
        frequency_penalty=0.5,
    )  # fmt: skip
    kw = dict(activations="float32", measure_costs=False)
    with LLM(**kw) as one:
        ids = chat(one, "Describe the weather in a city as JSON.")
        want = one.generate(ids, sp)[0]
    with LLM(tensor_parallel_size=3, **kw) as three:
        assert three.executor.model.config.num_kv_heads == 1
        got = three.generate(ids, sp)[0]
    assert got.token_ids == want.token_ids and got.finish_reason == "stop"
    jsonschema.validate(json.loads(got.text), SCHEMA)
