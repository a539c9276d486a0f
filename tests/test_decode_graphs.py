"""Decode steps from persistent buffers in batch and width buckets (executor/graphs.py), checked
on the CPU, where the runner calls each bucket's step function eagerly instead of replaying a
CUDA graph: the same tokens and logits as the plain path, step after step; padding rows touch
no request's KV; a step function that kept its first step's inputs (a closure instead of the
buffers) would be caught; steps that cannot replay run eagerly."""

from __future__ import annotations

import pytest
import torch

from tests.test_architectures import save_tiny
from tierserve.core.outputs import CachedRequestData, NewRequestData, SchedulerOutput
from tierserve.executor.graphs import batch_buckets, width_buckets
from tierserve.executor.torch_executor import TorchExecutor
from tierserve.model import registry
from tierserve.model.loader import load_model
from tierserve.sampling_params import SamplingParams

BS, BLOCKS = 4, 96
GREEDY = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, seed=7, max_tokens=64, top_logprobs=2, ignore_eos=True)


def test_buckets():
    assert batch_buckets(256)[:6] == [1, 2, 4, 8, 16, 24] and batch_buckets(256)[-1] == 256
    assert batch_buckets(3) == [1, 2, 3] and batch_buckets(1) == [1]
    assert batch_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert width_buckets(512) == [16, 32, 64, 128, 256, 512]
    assert width_buckets(40) == [16, 32, 40] and width_buckets(8) == [8]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mistral")
    save_tiny(folder, "MistralForCausalLM")  # a sliding window shorter than the prompts
    return load_model(folder)


def executor(loaded, graphs: str) -> TorchExecutor:
    model = registry.build_model(loaded.config, dict(loaded.weights), kernels=False)
    return TorchExecutor(
        model, BLOCKS, BS, measure=False, decode_graphs=graphs, max_model_len=128, max_seqs=12
    )


def drive(ex: TorchExecutor, prompts: dict[str, list[int]], steps: int):
    """Prefill every prompt, then `steps` decode steps (a request leaves after a few, so the
    batch changes size); each step's tokens, logprobs and top logprobs."""
    blocks = iter(range(BLOCKS))
    owned = {rid: [next(blocks) for _ in range(-(-len(p) // BS))] for rid, p in prompts.items()}
    lengths = {rid: len(p) for rid, p in prompts.items()}
    out = ex.execute(
        SchedulerOutput(
            0,
            scheduled_new=[
                NewRequestData(rid, p, len(p), SEEDED if rid == "b" else GREEDY, owned[rid], 0)
                for rid, p in prompts.items()
            ],
            num_scheduled_tokens={rid: len(p) for rid, p in prompts.items()},
        )
    )
    trace = [(out.sampled_token_ids, out.logprobs)]
    live = set(prompts)
    for step in range(steps):
        finished = {"c"} if step == 3 else set()
        live -= finished
        cached = []
        for rid in sorted(live):
            lengths[rid] += 1
            new = []
            if -(-(lengths[rid] + 1) // BS) > len(owned[rid]):
                new = [next(blocks)]
                owned[rid] += new
            cached.append(CachedRequestData(rid, new, lengths[rid]))
        out = ex.execute(
            SchedulerOutput(
                step + 1,
                scheduled_cached=cached,
                num_scheduled_tokens=dict.fromkeys(sorted(live), 1),
                finished_req_ids=finished,
            )
        )
        trace.append((out.sampled_token_ids, out.logprobs, out.top_logprobs))
    return trace, owned


PROMPTS = {"a": list(range(3, 24)), "b": list(range(40, 52)), "c": list(range(9, 42))}


def test_bucketed_buffered_steps_give_the_plain_paths_outputs(weights):
    plain, _ = drive(executor(weights, "off"), PROMPTS, steps=12)
    ex = executor(weights, "eager")
    graphs = ex.runner.graphs
    bucketed, _ = drive(ex, PROMPTS, steps=12)
    assert graphs.replays == 12  # every decode step went through the buffers
    for p, g in zip(plain, bucketed, strict=True):
        assert p[0] == g[0]  # tokens, greedy and seeded
        for rid in p[1]:
            assert g[1][rid] == pytest.approx(p[1][rid], abs=1e-4)
    # one step function per bucket, reused step after step: a function that had kept its
    # first step's inputs would have repeated that step's tokens above
    assert len(graphs.fns) == len(graphs.batches) * len(graphs.widths)


def test_padding_rows_write_only_the_scratch_block(weights):
    plain_ex, ex = executor(weights, "off"), executor(weights, "eager")
    _, owned = drive(plain_ex, PROMPTS, steps=6)
    drive(ex, PROMPTS, steps=6)  # 3 rows pad to 4, then 2 rows stay 2
    used = sorted(b for blocks in owned.values() for b in blocks)
    for (pk, _), (gk, gv) in zip(plain_ex.kv_caches, ex.kv_caches, strict=True):
        assert gk.shape[1] == pk.shape[1] + 1  # the scratch block
        assert torch.allclose(gk[:, used], pk[:, used], atol=1e-5)
        untouched = [b for b in range(BLOCKS) if b not in used]
        assert not gk[:, untouched].any() and not gv[:, untouched].any()
        assert gk[:, BLOCKS].any()  # the padding row wrote there


def test_steps_that_cannot_replay_run_eagerly(weights):
    ex = executor(weights, "eager")
    g = ex.runner.graphs
    drive(ex, {"a": list(range(3, 24))}, steps=0)  # a prefill alone
    assert g.replays == 0
    st = ex.states["a"]
    assert g.key({"a": st}, {"a": 1}, {"a": 2}) is None  # drafts to verify
    assert g.key({"a": st}, {"a": 1}, None) == (1, 16)
    long = type(st)(list(range(200)), 199, [], 199, GREEDY)
    assert g.key({"x": long}, {"x": 1}, None) is None  # past the captured width
