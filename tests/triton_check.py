"""Run by tests/test_triton_attention.py in a subprocess with TRITON_INTERPRET=1 (set before
Triton is imported): the Triton paged decode against the PyTorch reference, case by case.
Prints one line per case: name, max abs error."""

from __future__ import annotations

import sys

import torch

from tierserve.model.attention.base import PLAIN, AttentionSpec
from tierserve.model.attention.torch_paged import TorchMetadata, TorchPagedAttention
from tierserve.model.attention.triton_paged import paged_decode

BS = 16


def case(name, lens, heads=8, kv_heads=2, dim=16, spec=PLAIN, per_split=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    b = len(lens)
    width = max(-(-n // BS) for n in lens)
    blocks = b * width + 3
    k = torch.randn(kv_heads, blocks, BS, dim, generator=g)
    v = torch.randn(kv_heads, blocks, BS, dim, generator=g)
    q = torch.randn(b, heads, dim, generator=g)
    perm = torch.randperm(blocks, generator=g)[: b * width].view(b, width)  # scattered blocks
    lens_t = torch.tensor(lens, dtype=torch.long)
    ref_meta = TorchMetadata(
        TorchPagedAttention(),
        torch.zeros(b, dtype=torch.long),
        decode_rows=torch.arange(b),
        decode_blocks=perm.reshape(-1),
        decode_lens=lens_t,
        decode_width=width * BS,
    )
    ref = TorchPagedAttention()._decode(q, k, v, ref_meta, spec)
    got = paged_decode(q, k, v, perm, lens_t, spec, blocks_per_split=per_split)
    err = (got - ref).abs().max().item()
    print(f"{name} {err:.3e}", flush=True)
    return err


def through_the_executor() -> float:
    """A tiny Llama's decode steps from the graph runner's buffers with the Triton backend
    against the plain PyTorch path: the same tokens; the largest logprob difference."""
    import tempfile
    from pathlib import Path

    from tests.test_architectures import save_tiny
    from tests.test_decode_graphs import PROMPTS, drive, executor
    from tierserve.model.attention.triton_paged import TritonPagedAttention
    from tierserve.model.loader import load_model

    folder = Path(tempfile.mkdtemp())
    save_tiny(folder, "LlamaForCausalLM")
    loaded = load_model(folder)
    plain, _ = drive(executor(loaded, "off"), PROMPTS, steps=6)
    ex = executor(loaded, "eager")
    ex.model.torch_attention = TritonPagedAttention()
    ex.runner.graphs.model.torch_attention = ex.model.torch_attention
    fast, _ = drive(ex, PROMPTS, steps=6)
    assert ex.runner.graphs.replays == 6
    assert [t[0] for t in plain] == [t[0] for t in fast], "tokens differ"
    err = max(abs(f[1][r] - p[1][r]) for p, f in zip(plain, fast, strict=True) for r in p[1])
    print(f"executor-graph-steps {err:.3e}", flush=True)
    return err


if __name__ == "__main__":
    worst = max(
        through_the_executor(),
        case("lengths-1-15-16-17", [1, 15, 16, 17]),
        case("long-600-split", [600, 33], per_split=8),
        case("gqa-4-to-1-dim-64", [40, 7], heads=8, kv_heads=2, dim=64),
        case("mha-dim-24-padded", [19], heads=3, kv_heads=3, dim=24),
        case("sliding-window-8", [1, 9, 40], spec=AttentionSpec(window=8)),
        case("softcap-and-scale", [30, 64], spec=AttentionSpec(scale=0.3, softcap=2.0)),
    )
    sys.exit(0 if worst < 1e-4 else 1)
