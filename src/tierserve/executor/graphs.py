"""Decode steps replayed from CUDA graphs (GPU issue 40).

A decode step launches the same ~1,350 kernels every time, and on a GPU the step waits for
Python to issue them one by one. A graph captured once replays them in one launch. What a graph
reads must sit at the same addresses every step, so a decode-only step is run from persistent
device buffers:

* input ids, positions, KV slots, context lengths: ``[B_max]``;
* block tables: ``[B_max, W_max]`` block ids (W_max: the served context in blocks), updated in
  place from the executor's `BlockTables`, never reallocated.

Graphs are captured at start for every (batch bucket, width bucket): batch sizes 1, 2, 4, then
every 8 up to ``max_num_seqs``; widths (blocks of context the attention reads) in powers of two
up to the served context, so a step's attention reads at most twice its longest context. They
are captured largest first, into one memory pool. A step pads to its buckets; a padding row
writes its K/V into the scratch block (one block past those the KV manager hands out) and reads
only it, so padding touches no request's KV.

Only decode-only steps replay: a step with a prefill chunk, drafts to verify or prompt logprobs
runs eagerly (prefill is compute-bound already). The layer hook (P0's cut-in between two layers)
cannot run inside a graph: under graphs a P0 that arrives during a decode step waits for its
end, a few milliseconds on a GPU (docs/gpu.md).

On a machine without CUDA the same runner "replays" by calling the captured step function
eagerly from the same buffers (``capture=False``): the tests check the bucketing, padding and
buffer filling against the plain path there.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import torch

from tierserve.executor.batch import Batch
from tierserve.model.attention.torch_paged import TorchMetadata
from tierserve.model.sampler import SampleRow

if TYPE_CHECKING:
    from tierserve.executor.block_table import BlockTables
    from tierserve.executor.state import RequestState
    from tierserve.model.base import CausalLM

log = logging.getLogger("tierserve.engine")


def batch_buckets(max_seqs: int) -> list[int]:
    """1, 2, 4, then every 8 up to `max_seqs` (which is always the last)."""
    out = [b for b in (1, 2, 4) if b < max_seqs]
    out += list(range(8, max_seqs, 8))
    return [*out, max_seqs]


def width_buckets(max_blocks: int, smallest: int = 16) -> list[int]:
    """Context widths in blocks: powers of two from `smallest`, then `max_blocks`."""
    out, w = [], min(smallest, max_blocks)
    while w < max_blocks:
        out.append(w)
        w *= 2
    return [*out, max_blocks]


def bucket(sizes: list[int], n: int) -> int:
    """The smallest of `sizes` (ascending) that holds `n`."""
    return next(s for s in sizes if s >= n)


class DecodeGraphs:
    def __init__(
        self,
        model: CausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        block_size: int,
        max_seqs: int,
        max_blocks: int,
        scratch_block: int,
        capture: bool | None = None,
    ) -> None:
        """`scratch_block`: a block of the cache the KV manager never hands out (padding rows
        write and read only it). `capture`: record CUDA graphs (default: on CUDA); False:
        call the step function eagerly from the buffers (the CPU's stand-in)."""
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.batches = batch_buckets(max_seqs)
        self.widths = width_buckets(max_blocks)
        self.scratch = scratch_block
        self.capture = model.device.type == "cuda" if capture is None else capture
        dev, b, w = model.device, self.batches[-1], self.widths[-1]
        self.ids = torch.zeros(b, dtype=torch.long, device=dev)
        self.positions = torch.zeros(b, dtype=torch.long, device=dev)
        self.slots = torch.full((b,), scratch_block * block_size, dtype=torch.long, device=dev)
        self.lens = torch.ones(b, dtype=torch.long, device=dev)
        self.tables = torch.full((b, w), scratch_block, dtype=torch.long, device=dev)
        self.rows = torch.arange(b, dtype=torch.long, device=dev)
        self.fns: dict[tuple[int, int], Callable[[], torch.Tensor]] = {}
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.replays = 0

    # -- which steps ---------------------------------------------------------------------
    def key(
        self,
        states: dict[str, RequestState],
        scheduled: dict[str, int],
        drafts: dict[str, int] | None,
    ) -> tuple[int, int] | None:
        """The (batch, width) buckets a step replays in; None: it runs eagerly."""
        if drafts or not scheduled or len(scheduled) > self.batches[-1]:
            return None
        longest = 0
        for rid, n in scheduled.items():
            st = states[rid]
            if n != 1 or st.num_computed + 1 != len(st.tokens) or st.params.max_tokens <= 0:
                return None  # a prefill chunk, or a teacher-forced row
            if st.params.prompt_logprobs is not None and st.num_computed < st.num_prompt - 1:
                return None
            longest = max(longest, st.num_computed + 1)
        blocks = -(-longest // self.block_size)
        if blocks > self.widths[-1]:
            return None
        return bucket(self.batches, len(scheduled)), bucket(self.widths, blocks)

    # -- the step function: reads only the buffers -----------------------------------------
    def step_fn(self, b: int, w: int) -> Callable[[], torch.Tensor]:
        backend, bs, model = self.model.torch_attention, self.block_size, self.model

        def step() -> torch.Tensor:
            meta = TorchMetadata(
                backend,
                self.slots[:b],
                decode_rows=self.rows[:b],
                decode_blocks=self.tables[:b, :w].reshape(-1),
                decode_lens=self.lens[:b],
                decode_width=w * bs,
                dtype=model.dtype,
            )
            return model.forward(
                self.ids[:b], self.positions[:b], meta, self.kv_caches, self.rows[:b]
            )

        return step

    def capture_all(self) -> None:
        """Every (batch, width) bucket, largest first, into one pool; logs time and memory."""
        keys = sorted(((b, w) for b in self.batches for w in self.widths), reverse=True)
        for k in keys:
            self.fns[k] = self.step_fn(*k)
        if not self.capture:
            return
        t0, before = time.perf_counter(), torch.cuda.memory_allocated()
        pool = torch.cuda.graph_pool_handle()
        hook, self.model.layer_hook = self.model.layer_hook, None
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):  # warm-up off the capture (cuBLAS workspaces, autotune)
                    self.fns[keys[0]]()
            torch.cuda.current_stream().wait_stream(stream)
            for k in keys:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    out = self.fns[k]()
                self.graphs[k] = (graph, out)
        finally:
            self.model.layer_hook = hook
        torch.cuda.synchronize()
        log.info(
            "decode graphs: %d captured (batch %s, width %s blocks) in %.1f s, %.2f GiB",
            len(keys),
            f"{self.batches[0]}..{self.batches[-1]}",
            f"{self.widths[0]}..{self.widths[-1]}",
            time.perf_counter() - t0,
            (torch.cuda.memory_allocated() - before) / (1 << 30),
        )

    # -- one step ------------------------------------------------------------------------
    def fill(
        self,
        states: dict[str, RequestState],
        scheduled: dict[str, int],
        tables: BlockTables,
        key: tuple[int, int],
    ) -> Batch:
        """The step's inputs into the buffers (padding rows: the scratch block), and the batch
        the sampler reads (its sampling rows; the tensors are the buffers' views)."""
        b, w = key
        n, bs = len(scheduled), self.block_size
        pos = np.empty(b, dtype=np.int64)
        ids = np.zeros(b, dtype=np.int64)
        table_rows = np.empty(n, dtype=np.int64)
        sample_rows = []
        for i, rid in enumerate(scheduled):
            st = states[rid]
            pos[i] = st.num_computed
            ids[i] = st.tokens[st.num_computed]
            table_rows[i] = st.table_row
            sample_rows.append(
                SampleRow(st.params, len(st.tokens) - st.num_prompt, st.slot, st.eos)
            )
        pos[n:] = 0
        host_tables = np.full((b, w), self.scratch, dtype=np.int64)
        cols = min(w, tables.array.shape[1])  # (the host tables grow as requests do)
        host_tables[:n, :cols] = tables.array[table_rows, :cols]
        real = pos[:n]
        slots = np.full(b, self.scratch * bs, dtype=np.int64)
        slots[:n] = host_tables[np.arange(n), real // bs] * bs + real % bs
        lens = pos + 1
        lens[n:] = 1
        for buf, host in (
            (self.ids[:b], ids),
            (self.positions[:b], pos),
            (self.slots[:b], slots),
            (self.lens[:b], lens),
        ):
            buf.copy_(torch.from_numpy(host), non_blocking=True)
        self.tables[:b, :w].copy_(torch.from_numpy(host_tables), non_blocking=True)
        return Batch(
            input_ids=self.ids[:n],
            positions=self.positions[:n],
            meta=None,  # type: ignore[arg-type]  (the graph's own, built from the buffers)
            logits_rows=self.rows[:n],
            sample_ids=list(scheduled),
            sample_rows=sample_rows,
        )

    def run(
        self,
        states: dict[str, RequestState],
        scheduled: dict[str, int],
        tables: BlockTables,
        key: tuple[int, int],
    ) -> tuple[Batch, torch.Tensor]:
        """Replay the step of bucket `key` over `scheduled`: its batch and its rows' logits."""
        batch = self.fill(states, scheduled, tables, key)
        self.replays += 1
        if key in self.graphs:
            graph, out = self.graphs[key]
            graph.replay()
        else:
            if key not in self.fns:
                self.fns[key] = self.step_fn(*key)
            hook, self.model.layer_hook = self.model.layer_hook, None  # as under a graph
            try:
                out = self.fns[key]()
            finally:
                self.model.layer_hook = hook
        return batch, out[: len(scheduled)]
