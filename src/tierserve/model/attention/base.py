"""The attention backend interface and the backend-neutral description of a step's batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class BatchLayout:
    """Where each request of a step sits: its flat rows ``[rows[i], rows[i] + counts[i])``
    hold positions ``starts[i] ...``; `table_rows` index the executor's `BlockTables`."""

    tables: object  # executor/block_table.BlockTables
    starts: np.ndarray
    counts: np.ndarray
    rows: np.ndarray
    table_rows: np.ndarray
    slot_mapping: torch.Tensor  # [T] where each new token's K/V goes
    block_size: int
    dtype: torch.dtype


@dataclass
class AttentionMetadata:
    backend: AttentionBackend
    slot_mapping: torch.Tensor
    # Every row attends through cached context (the fused decoder layer's precondition).
    all_cached: bool = False

    def to(self, device: torch.device) -> AttentionMetadata:
        """A copy of the tensors on `device` (the batch is built on the CPU)."""
        for name, value in list(vars(self).items()):
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.to(device, non_blocking=True))
        return self


class AttentionBackend:
    name = "base"

    def build(self, layout: BatchLayout, fused: bool = False) -> AttentionMetadata:
        """Metadata for one step. `fused`: the model runs whole fused layers (kernel only)."""
        raise NotImplementedError

    def forward(
        self,
        q: torch.Tensor,  # [T, H, D]
        k: torch.Tensor,  # [T, H_kv, D]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [H_kv, blocks, block_size, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Writes k/v to the cache at `meta.slot_mapping`; returns the attention output."""
        raise NotImplementedError


@dataclass
class FreshPrompt:
    """Rows [start, end) of a chunk from position 0: it attends causally to its own keys."""

    start: int
    end: int


def fresh_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: FreshPrompt):
    """SDPA over the chunk's own keys, [n, H, D]."""
    qp = q[p.start : p.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
    kp = k[p.start : p.end].transpose(0, 1).unsqueeze(0)
    vp = v[p.start : p.end].transpose(0, 1).unsqueeze(0)
    op = torch.nn.functional.scaled_dot_product_attention(
        qp, kp, vp, is_causal=True, enable_gqa=True
    )
    return op[0].transpose(0, 1)


def write_kv(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """cache [H, blocks, block_size, D]; x [T, H, D] written at token `slots` (one kernel)."""
    h, nb, bs, d = cache.shape
    cache.view(h, nb * bs, d).index_copy_(1, slots, x.transpose(0, 1))
