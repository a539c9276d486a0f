"""Turn one step's scheduled requests into flat model inputs and paged-attention metadata."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from tierserve.model.attention import AttentionMetadata, PrefillSeq
from tierserve.model.sampler import SampleRow

if TYPE_CHECKING:
    from tierserve.executor.torch_executor import RequestState


@dataclass
class Batch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    logits_rows: torch.Tensor
    sample_ids: list[str] = field(default_factory=list)
    sample_rows: list[SampleRow] = field(default_factory=list)


def _slots(block_ids: list[int], start: int, end: int, block_size: int) -> list[int]:
    return [block_ids[p // block_size] * block_size + p % block_size for p in range(start, end)]


def build_batch(
    states: dict[str, RequestState],
    scheduled: dict[str, int],
    block_size: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> Batch:
    ids: list[int] = []
    pos: list[int] = []
    slot_mapping: list[int] = []
    decode_rows: list[int] = []
    decode_tables: list[list[int]] = []
    decode_lens: list[int] = []
    prefills: list[PrefillSeq] = []
    logits_rows: list[int] = []
    sample_ids: list[str] = []
    sample_rows: list[SampleRow] = []
    for rid, n in scheduled.items():
        st = states[rid]
        start, row = st.num_computed, len(ids)
        end = start + n
        if end > len(st.tokens):
            raise ValueError(f"{rid}: scheduled past its known tokens")
        ids.extend(st.tokens[start:end])
        pos.extend(range(start, end))
        slot_mapping.extend(_slots(st.block_ids, start, end, block_size))
        if n == 1:
            decode_rows.append(row)
            decode_tables.append(st.block_ids)
            decode_lens.append(end)
        elif start == 0:
            prefills.append(PrefillSeq(row, row + n, None, None))
        else:
            ctx = torch.tensor(_slots(st.block_ids, 0, end, block_size), device=device)
            q_pos = torch.arange(start, end, device=device)[:, None]
            mask = torch.arange(end, device=device)[None, :] <= q_pos
            prefills.append(PrefillSeq(row, row + n, ctx, mask))
        if end == len(st.tokens):
            logits_rows.append(row + n - 1)
            sample_ids.append(rid)
            sample_rows.append(SampleRow(st.params, len(st.tokens) - st.num_prompt))
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slot_mapping, dtype=torch.long, device=device),
        prefills=prefills,
    )
    if decode_rows:
        width = max(-(-n // block_size) for n in decode_lens)
        flat = [bid for t in decode_tables for bid in (t[:width] + [0] * (width - len(t)))]
        lens = torch.tensor(decode_lens, device=device)
        p = torch.arange(width * block_size, device=device)
        meta.decode_rows = torch.tensor(decode_rows, dtype=torch.long, device=device)
        meta.decode_blocks = torch.tensor(flat, dtype=torch.long, device=device)
        pad = p[None, :] >= lens[:, None]
        bias = torch.zeros(pad.shape, dtype=dtype, device=device).masked_fill_(pad, float("-inf"))
        meta.decode_bias = bias[:, None, :]  # [B, 1, L]
        meta.all_decode = len(decode_rows) == len(ids)
    return Batch(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.tensor(pos, dtype=torch.long, device=device),
        meta=meta,
        logits_rows=torch.tensor(logits_rows, dtype=torch.long, device=device),
        sample_ids=sample_ids,
        sample_rows=sample_rows,
    )
