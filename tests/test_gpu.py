"""On CUDA (the `gpu` marker; skipped without it, run by benchmarks/gpu/check.sh): decode steps
replayed from captured CUDA graphs give the eager path's greedy tokens, bf16, on the same
weights; a decode step reads the device once."""

from __future__ import annotations

import pytest
import torch

from tests.test_decode_graphs import PROMPTS, drive
from tests.test_step_sync import run_decode_step
from tierserve.executor.torch_executor import TorchExecutor
from tierserve.model import registry

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from tests.test_architectures import save_tiny
    from tierserve.model.loader import load_model

    folder = tmp_path_factory.mktemp("llama")
    save_tiny(folder, "LlamaForCausalLM")
    return load_model(folder)


def cuda_executor(loaded, graphs: str) -> TorchExecutor:
    model = registry.build_model(loaded.config, dict(loaded.weights), "cuda", torch.bfloat16)
    return TorchExecutor(
        model, 96, 4, measure=False, decode_graphs=graphs, max_model_len=128, max_seqs=12
    )


def test_graph_replays_give_the_eager_tokens(loaded):
    eager, _ = drive(cuda_executor(loaded, "off"), PROMPTS, steps=12)
    ex = cuda_executor(loaded, "capture")
    assert ex.runner.graphs.graphs  # captured at start
    replayed, _ = drive(ex, PROMPTS, steps=12)
    assert ex.runner.graphs.replays == 12
    assert [t[0] for t in replayed] == [t[0] for t in eager]


def test_a_cuda_decode_step_reads_the_device_once(loaded, monkeypatch):
    model = registry.build_model(loaded.config, dict(loaded.weights), "cuda", torch.bfloat16)
    ex = TorchExecutor(model, num_blocks=64, block_size=16, measure=False)
    seen, copies = run_decode_step(ex, monkeypatch)
    assert not seen and copies == 1
