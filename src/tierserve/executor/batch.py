"""Turn one step's scheduled requests into flat model inputs and paged-attention metadata.

Positions and KV slots come from array operations over the step's requests (no Python loop over
tokens): token t of request r sits at position ``start_r + (t - row_r)`` and its slot is
``table[r][pos // block_size] * block_size + pos % block_size``, read from the executor's
persistent block tables (`BlockTables`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch

from tierserve.model.attention import AttentionMetadata, PrefillSeq
from tierserve.model.sampler import SampleRow

if TYPE_CHECKING:
    from tierserve.executor.block_table import BlockTables
    from tierserve.executor.torch_executor import RequestState


@dataclass
class ScoreSpan:
    """Prompt logprobs of one request in this step: flat rows `rows` predict its prompt tokens
    `start`, `start + 1`, ..."""

    request_id: str
    start: int
    rows: range
    k: int  # alternatives per position


@dataclass
class Batch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_rows: torch.Tensor
    sample_ids: list[str] = field(default_factory=list)
    sample_rows: list[SampleRow] = field(default_factory=list)
    # Prompt logprobs: the flat rows whose final hidden states are scored, and their targets.
    score_spans: list[ScoreSpan] = field(default_factory=list)
    score_targets: list[int] = field(default_factory=list)

    @property
    def hidden_rows(self) -> torch.Tensor | None:
        if not self.score_spans:
            return None
        return torch.tensor([i for s in self.score_spans for i in s.rows], dtype=torch.long)


def build_batch(
    states: dict[str, RequestState],
    scheduled: dict[str, int],
    block_size: int,
    tables: BlockTables,
    dtype: torch.dtype = torch.float32,
    segments: bool = False,
    device: torch.device | str = "cpu",
    fuse_rows: int = 0,
) -> Batch:
    """`segments`: describe decodes and continued prefill chunks as kernel segments (rows, table
    row, context) instead of the padded gather tables of the PyTorch path; in a step of at most
    `fuse_rows` rows, chunks from position 0 too (the model then runs whole fused layers)."""
    ids: list[int] = []
    starts, counts, table_rows = [], [], []
    logits_rows: list[int] = []
    sample_ids: list[str] = []
    sample_rows: list[SampleRow] = []
    spans: list[ScoreSpan] = []
    targets: list[int] = []
    for rid, n in scheduled.items():
        st = states[rid]
        start = st.num_computed
        if start + n > len(st.tokens):
            raise ValueError(f"{rid}: scheduled past its known tokens")
        ids.extend(st.tokens[start : start + n])
        starts.append(start)
        counts.append(n)
        table_rows.append(st.table_row)
        if st.params.prompt_logprobs is not None and start < st.num_prompt - 1:
            # positions start .. predict prompt tokens start + 1 .. (the last prompt
            # position predicts the first output token: that is the sampling row)
            m = min(n, st.num_prompt - 1 - start)
            first = len(ids) - n
            spans.append(
                ScoreSpan(rid, start + 1, range(first, first + m), st.params.prompt_logprobs)
            )
            targets.extend(st.tokens[start + 1 : start + 1 + m])
        if start + n == len(st.tokens) and st.params.max_tokens > 0:
            logits_rows.append(len(ids) - 1)
            sample_ids.append(rid)
            sample_rows.append(
                SampleRow(st.params, len(st.tokens) - st.num_prompt, st.slot, st.eos)
            )
    start_a = np.asarray(starts, dtype=np.int64)
    count_a = np.asarray(counts, dtype=np.int64)
    row_a = np.cumsum(count_a) - count_a  # first flat row of each request
    total = int(count_a.sum())
    pos = np.arange(total, dtype=np.int64) + np.repeat(start_a - row_a, count_a)
    blocks = tables.array[np.repeat(np.asarray(table_rows), count_a), pos // block_size]
    slots = blocks.astype(np.int64) * block_size + pos % block_size
    meta = AttentionMetadata(slot_mapping=torch.from_numpy(slots))
    if segments:
        fresh_too = total <= fuse_rows
        _segment_meta(meta, tables, start_a, count_a, row_a, table_rows, fresh_too)
    else:
        _gather_meta(meta, tables, start_a, count_a, row_a, table_rows, block_size, dtype)
    batch = Batch(
        input_ids=torch.tensor(ids, dtype=torch.long),
        positions=torch.from_numpy(pos),
        meta=meta,
        logits_rows=torch.tensor(logits_rows, dtype=torch.long),
        sample_ids=sample_ids,
        sample_rows=sample_rows,
        score_spans=spans,
        score_targets=targets,
    )
    return batch if torch.device(device).type == "cpu" else _to(batch, torch.device(device))


def _to(batch: Batch, device: torch.device) -> Batch:
    """Built on the CPU; moved in one place for a CUDA model."""
    m = batch.meta
    for obj, names in (
        (batch, ("input_ids", "positions", "logits_rows")),
        (m, ("slot_mapping", "decode_rows", "decode_blocks", "decode_bias", "tables", "segments")),
    ):
        for name in names:
            t = getattr(obj, name)
            if t is not None:
                setattr(obj, name, t.to(device, non_blocking=True))
    for p in m.prefills:
        p.slots = None if p.slots is None else p.slots.to(device)
        p.mask = None if p.mask is None else p.mask.to(device)
    return batch


def _segment_meta(meta, tables, starts, counts, rows, table_rows, fresh_too) -> None:
    """Every request that reads cached context (a decode, or a chunk after computed tokens) is
    one kernel segment; a chunk from position 0 attends to its own keys (PrefillSeq), unless
    `fresh_too`: its keys are in the cache before attention, so it can be a segment as well."""
    cached = (starts >= 0) if fresh_too else (starts > 0)
    meta.tables = tables.tensor
    seg = np.stack([rows, counts, np.asarray(table_rows), starts + 1], axis=1)[cached]
    meta.segments = torch.from_numpy(seg.astype(np.int32))
    meta.all_decode = bool(cached.all())
    for i in np.flatnonzero(~cached).tolist():
        meta.prefills.append(PrefillSeq(int(rows[i]), int(rows[i] + counts[i]), None, None))


def _gather_meta(meta, tables, starts, counts, rows, table_rows, block_size, dtype) -> None:
    """The PyTorch path: decodes gather a padded [B, width] table; a chunk continuing a cached
    prefix gathers its context slots and a shifted causal mask."""
    decode = counts == 1
    t_rows = np.asarray(table_rows)
    for i in np.flatnonzero(~decode).tolist():
        start, end, row = int(starts[i]), int(starts[i] + counts[i]), int(rows[i])
        if start == 0:
            meta.prefills.append(PrefillSeq(row, row + int(counts[i]), None, None))
            continue
        p = np.arange(end)
        ctx = tables.array[t_rows[i], p // block_size].astype(np.int64) * block_size
        ctx = torch.from_numpy(ctx + p % block_size)
        mask = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
        meta.prefills.append(PrefillSeq(row, row + int(counts[i]), ctx, mask))
    if not decode.any():
        return
    lens = torch.from_numpy(starts[decode] + 1)
    width = -(-int(lens.max()) // block_size)
    table = tables.tensor[torch.from_numpy(t_rows[decode]), :width]
    meta.decode_rows = torch.from_numpy(rows[decode])
    meta.decode_blocks = table.reshape(-1).long()
    pad = torch.arange(width * block_size)[None, :] >= lens[:, None]
    bias = torch.zeros(pad.shape, dtype=dtype).masked_fill_(pad, float("-inf"))
    meta.decode_bias = bias[:, None, :]  # [B, 1, L]
    meta.all_decode = bool(decode.all())
