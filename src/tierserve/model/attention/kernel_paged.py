"""The compiled CPU kernel backend (`kernels/csrc/attention.cpp`): K/V read straight from the
paged cache through the executor's persistent int32 block tables, no gathered copy.

A *segment* (row0, rows, table row, context of the first row) is a run of rows of one request
with causal contexts: a decode, or a chunk continuing cached tokens. A chunk from position 0 is
a segment too (its keys are in the cache before it attends), so that its rows are the bits a
cached prefix or a decode would give (`invariant`, the default; the fused decoder layer needs
every row in one anyway); with invariance off, on the op-by-op path it attends to its own keys
through SDPA.

It runs causal attention with any score scale; sliding windows and soft-capping are the
PyTorch backend's (a model with them runs the ``mixed`` path, `model/plan.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from tierserve.model.attention.base import (
    PLAIN,
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    BatchLayout,
    FreshPrompt,
    fresh_prefill,
    write_kv,
)


@dataclass
class KernelMetadata(AttentionMetadata):
    tables: torch.Tensor | None = None  # [rows, width] int32
    segments: torch.Tensor | None = None  # [n, 4] int32
    fresh: list[FreshPrompt] = field(default_factory=list)
    fused: bool = False  # the model runs whole fused decoder layers on this step


class KernelPagedAttention(AttentionBackend):
    name = "kernel"

    def __init__(self, kernels) -> None:
        self.kernels = kernels
        self.invariant = True  # fresh prompts as segments (Model.set_batch_invariant)

    def supports(self, spec: AttentionSpec, group: int, head_dim: int, block_size: int) -> bool:
        if spec.window is not None or spec.softcap is not None:
            return False
        return self.kernels.attention_supported(group, head_dim, block_size)

    def build(self, layout: BatchLayout, fused: bool = False) -> KernelMetadata:
        starts, counts, rows = layout.starts, layout.counts, layout.rows
        cached = (starts >= 0) if (fused or self.invariant) else (starts > 0)
        seg = np.stack([rows, counts, layout.table_rows, starts + 1], axis=1)[cached]
        meta = KernelMetadata(
            self,
            layout.slot_mapping,
            all_cached=bool(cached.all()),
            tables=layout.tables.tensor,
            segments=torch.from_numpy(seg.astype(np.int32)),
            fused=fused,
        )
        for i in np.flatnonzero(~cached).tolist():
            meta.fresh.append(FreshPrompt(int(rows[i]), int(rows[i] + counts[i])))
        return meta

    def forward(
        self, q, k, v, k_cache, v_cache, meta: KernelMetadata, spec: AttentionSpec = PLAIN
    ) -> torch.Tensor:
        write_kv(k_cache, meta.slot_mapping, k, self.kernels.vector_lanes())  # K in tiles
        write_kv(v_cache, meta.slot_mapping, v)
        out = q.new_empty(q.shape)
        if meta.segments.shape[0]:
            scale = spec.scale_for(k_cache.shape[-1])
            self.kernels.paged_attention_into(
                q, k_cache, v_cache, meta.tables, meta.segments, scale, out
            )
        for p in meta.fresh:
            out[p.start : p.end] = fresh_prefill(q, k, v, p, spec, meta.fresh_dtype, k_cache.dtype)
        return out
