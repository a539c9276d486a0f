"""KV cache size on a GPU, as vLLM sizes it (`--gpu-memory-utilization`, default 0.9): the engine
may use that share of the GPU's memory; after the weights load, two profiling steps measure the
activations' peak (a prefill of the step's token budget, and a decode of the largest batch at
the served context: what the PyTorch attention gathers grows with both), and the KV cache takes
what is left. Decode graphs hold their own pool, about one decode step's activations, so that
much more is set aside when they are on. An explicit `--kv-cache-gib` or `--num-kv-blocks`
overrides all of this."""

from __future__ import annotations

import logging

import torch

from tierserve.executor.batch import forward_step
from tierserve.executor.block_table import BlockTables
from tierserve.executor.kv_memory import allocate_caches, kv_bytes_per_block
from tierserve.executor.state import RequestState
from tierserve.sampling_params import SamplingParams

log = logging.getLogger("tierserve.engine")
GIB = 1 << 30


def kv_budget_bytes(
    total: int, utilization: float, weights: int, activations: int, non_torch: int, graphs: bool
) -> int:
    """What the KV cache may take of a GPU of `total` bytes: the engine's share, less the
    weights, the activations' peak (twice with graphs: their pool is their own) and the memory
    that is not torch's (the CUDA context, libraries)."""
    return int(total * utilization) - weights - activations * (2 if graphs else 1) - non_torch


def _profile_steps(model, block_size: int, prefill_tokens: int, rows: int, context: int) -> None:
    """A prefill of `prefill_tokens` and a decode of `rows` rows at `context` tokens each, into
    scratch caches (a decode reads its blocks; which blocks does not change its memory)."""
    sp = SamplingParams(max_tokens=1)
    vocab = max(1, model.config.vocab_size - 1)
    n_blocks = -(-prefill_tokens // block_size)
    caches = allocate_caches(model, n_blocks, block_size)
    tables = BlockTables()
    toks = [1 + i % vocab for i in range(prefill_tokens)]
    st = RequestState(toks, prefill_tokens, list(range(n_blocks)), 0, sp)
    st.table_row = tables.assign(st.block_ids)
    forward_step(model, caches, tables, block_size, {"p": st}, {"p": prefill_tokens}, "torch")
    width = -(-context // block_size)
    states = {}
    for r in range(rows):
        s = RequestState([1] * context, context - 1, [0] * width, context - 1, sp)
        s.table_row = tables.assign(s.block_ids)
        states[f"d{r}"] = s
    forward_step(model, caches, tables, block_size, states, dict.fromkeys(states, 1), "torch")
    del caches


def kv_blocks_for_utilization(
    model,
    block_size: int,
    utilization: float,
    prefill_tokens: int,
    rows: int,
    context: int,
    graphs: bool,
) -> int:
    """The KV blocks that fit this GPU at `utilization` (CUDA only; see the module's doc)."""
    torch.cuda.synchronize()
    weights = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        _profile_steps(model, block_size, prefill_tokens, rows, context)
    torch.cuda.synchronize()
    activations = torch.cuda.max_memory_allocated() - weights
    free, total = torch.cuda.mem_get_info()
    non_torch = max(0, (total - free) - torch.cuda.memory_reserved())
    torch.cuda.empty_cache()
    budget = kv_budget_bytes(total, utilization, weights, activations, non_torch, graphs)
    per_block = kv_bytes_per_block(model, block_size)
    blocks = budget // per_block
    if blocks < 1:
        raise ValueError(
            f"--gpu-memory-utilization {utilization}: nothing is left for the KV cache "
            f"(weights {weights / GIB:.1f} GiB, activations {activations / GIB:.1f} GiB"
            f"{' x2 with decode graphs' if graphs else ''}, of {total * utilization / GIB:.1f} "
            "GiB allowed): raise it, lower --max-num-seqs or --max-num-batched-tokens, or set "
            "--kv-cache-gib"
        )
    log.info(
        "KV cache by --gpu-memory-utilization %.2f: %.1f GiB of %.1f GiB (weights %.1f GiB, "
        "activations %.1f GiB%s, other %.1f GiB)",
        utilization,
        blocks * per_block / GIB,
        total / GIB,
        weights / GIB,
        activations / GIB,
        " x2 with decode graphs" if graphs else "",
        non_torch / GIB,
    )
    return int(blocks)
