"""A decode step reads from the device once (GPU issue 40): the step's tokens, their logprobs and
any asked-for top-k come back in one device-to-host copy, and nothing else in the step path
(`.item()`, `int(tensor)`, `.tolist()`, `nonzero`, a boolean mask's indexing) waits for the
device. Checked on the CPU through the pure-PyTorch path, the one CUDA runs: a dispatch mode
counts the ops that would block a GPU, and `Tensor.tolist` is counted too."""

from __future__ import annotations

import collections

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.test_architectures import save_tiny
from tierserve.executor.state import RequestState
from tierserve.executor.torch_executor import TorchExecutor
from tierserve.model import registry
from tierserve.model.loader import load_model
from tierserve.sampling_params import SamplingParams

SYNCING = {"_local_scalar_dense", "nonzero", "item", "masked_select", "unique"}


class SyncCounter(TorchDispatchMode):
    """Counts the ops that make a GPU stream wait for the host to read a result."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in SYNCING:
            self.seen[name] += 1
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def executor(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    save_tiny(folder, "LlamaForCausalLM")
    loaded = load_model(folder)
    model = registry.build_model(loaded.config, dict(loaded.weights), kernels=False)  # as on CUDA
    return TorchExecutor(model, num_blocks=64, block_size=16, measure=False)


PARAMS = (
    SamplingParams(temperature=0, max_tokens=8, ignore_eos=True),
    SamplingParams(temperature=0.8, seed=3, max_tokens=8, top_logprobs=3, ignore_eos=True),
    SamplingParams(temperature=1.0, top_p=0.9, top_k=5, min_p=0.01, max_tokens=8),
    SamplingParams(temperature=0, max_tokens=8, top_logprobs=2, ignore_eos=True),
)


def run_decode_step(ex: TorchExecutor, monkeypatch) -> tuple[collections.Counter, int]:
    for rid in list(ex.states):
        ex.drop_state(rid)
    states = {}
    for i, params in enumerate(PARAMS):
        n = 20 + 3 * i  # a block edge and the blocks' middles
        st = RequestState(list(range(1, n + 1)), n, list(range(i * 4, i * 4 + 4)), 0, params)
        assert ex.add_state(f"r{i}", st) is None
        states[f"r{i}"] = st
    ex.forward(states, {rid: len(st.tokens) for rid, st in states.items()})  # the prefill
    copies = []
    tolist = torch.Tensor.tolist

    def counted(t):
        copies.append(tuple(t.shape))
        return tolist(t)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    with SyncCounter() as guard:
        out = ex.forward(states, dict.fromkeys(states, 1))
    monkeypatch.setattr(torch.Tensor, "tolist", tolist)
    assert set(out.sampled_token_ids) == set(states) and not out.failed
    assert set(out.top_logprobs) == {"r1", "r3"}
    assert len(out.top_logprobs["r1"][0]) == 3 and len(out.top_logprobs["r3"][0]) == 2
    return guard.seen, len(copies)


def test_a_decode_step_reads_the_device_once(executor, monkeypatch):
    seen, copies = run_decode_step(executor, monkeypatch)
    assert not seen, f"ops that wait for the device in a decode step: {dict(seen)}"
    assert copies == 1


def test_the_guard_sees_a_read_added_back(executor, monkeypatch):
    """The guard is not blind: an `.item()` slipped into the sampler is caught."""
    from tierserve.model import sampler

    real = sampler.filter_logits

    def with_a_read(logits, params):
        float(logits.max())  # what a careless edit would add
        return real(logits, params)

    monkeypatch.setattr(sampler, "filter_logits", with_a_read)
    seen, _ = run_decode_step(executor, monkeypatch)
    assert seen["item"] + seen["_local_scalar_dense"] >= 1
