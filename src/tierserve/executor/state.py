"""What the executor holds for each request it serves: its tokens, its blocks, where it stands,
its sampling parameters, and its rows in the executor's tables. Plain data, torch-free."""

from __future__ import annotations

from dataclasses import dataclass

from tierserve.sampling_params import SamplingParams


@dataclass
class RequestState:
    tokens: list[int]
    num_prompt: int
    block_ids: list[int]
    num_computed: int
    params: SamplingParams
    table_row: int = -1  # this request's row in the executor's BlockTables
    eos: int | None = None
    slot: int = -1  # this request's slot in the penalty token counts (-1: none)
