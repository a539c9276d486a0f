"""Turn one step's scheduled requests into flat model inputs and paged-attention metadata
(built by the step's attention backend from a backend-neutral `BatchLayout`).

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

from tierserve.model.attention import AttentionBackend, AttentionMetadata, BatchLayout
from tierserve.model.plan import uses_blas
from tierserve.model.sampler import SampleRow

if TYPE_CHECKING:
    from tierserve.executor.block_table import BlockTables
    from tierserve.executor.state import RequestState


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
    backend: AttentionBackend,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    fused: bool = False,
    drafts: dict[str, int] | None = None,
) -> Batch:
    """The step's flat inputs, with attention metadata built by `backend` (`fused`: the model
    will run whole fused decoder layers, so every request becomes a kernel segment). A request
    in `drafts` verifies that many draft tokens (the last of its known tokens): each of its last
    k + 1 positions gets a logits row and a sampling row, in order."""
    drafts = drafts or {}
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
            k = drafts.get(rid, 0)
            for j in range(k, -1, -1):
                logits_rows.append(len(ids) - 1 - j)
                sample_ids.append(rid)
                sample_rows.append(
                    SampleRow(st.params, len(st.tokens) - st.num_prompt - j, st.slot, st.eos)
                )
    start_a = np.asarray(starts, dtype=np.int64)
    count_a = np.asarray(counts, dtype=np.int64)
    row_a = np.cumsum(count_a) - count_a  # first flat row of each request
    total = int(count_a.sum())
    pos = np.arange(total, dtype=np.int64) + np.repeat(start_a - row_a, count_a)
    blocks = tables.array[np.repeat(np.asarray(table_rows), count_a), pos // block_size]
    slots = blocks.astype(np.int64) * block_size + pos % block_size
    layout = BatchLayout(
        tables,
        start_a,
        count_a,
        row_a,
        np.asarray(table_rows, dtype=np.int64),
        torch.from_numpy(slots),
        block_size,
        dtype,
    )
    batch = Batch(
        input_ids=torch.tensor(ids, dtype=torch.long),
        positions=torch.from_numpy(pos),
        meta=backend.build(layout, fused),
        logits_rows=torch.tensor(logits_rows, dtype=torch.long),
        sample_ids=sample_ids,
        sample_rows=sample_rows,
        score_spans=spans,
        score_targets=targets,
    )
    return batch if torch.device(device).type == "cpu" else _to(batch, torch.device(device))


def _to(batch: Batch, device: torch.device) -> Batch:
    """Built on the CPU; moved in one place for a CUDA model."""
    for name in ("input_ids", "positions", "logits_rows"):
        setattr(batch, name, getattr(batch, name).to(device, non_blocking=True))
    batch.meta = batch.meta.to(device)
    return batch


def forward_step(
    model,
    kv_caches,
    tables: BlockTables,
    block_size: int,
    states: dict[str, RequestState],
    scheduled: dict[str, int],
    path: str,
    drafts: dict[str, int] | None = None,
    hidden: bool = True,
) -> tuple[Batch, object]:
    """One forward pass of `model` along step path `path`: the batch built for it, and the
    model's output (logits; with `hidden`, also the hidden rows scoring asks for)."""
    batch = build_batch(
        states,
        scheduled,
        block_size,
        tables,
        model.backend(path),
        model.dtype,
        device=model.device,
        fused=path == "fused",
        drafts=drafts,
    )
    out = model.forward(
        batch.input_ids,
        batch.positions,
        batch.meta,
        kv_caches,
        batch.logits_rows,
        batch.hidden_rows if hidden else None,
        blas=uses_blas(path),
    )
    return batch, out
