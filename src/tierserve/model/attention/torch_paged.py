"""The pure-PyTorch backend (the reference, and the path on CUDA).

KV cache layout, per layer and for K and V alike::

    [kv_heads, num_blocks, block_size, head_dim]      token slot = block_id * block_size + offset

Head-major, so that gathering one request's blocks for one head is an ``index_select`` on the
leading dimension of a contiguous ``[num_blocks, block_size, head_dim]`` tensor (measured ~7x
faster on CPU than gathering along an inner dimension), and the gathered context of a batch lands
directly in the ``[kv_heads, batch, length, head_dim]`` layout the matmuls want, with no copy.

Each step first writes the new tokens' K/V into their slots, then attends:

* single-token queries (decodes) together: their block tables (padded to the longest) gather one
  ``[kv_heads, B, L_max, head_dim]`` context; grouped-query attention is two batched matmuls
  (query heads grouped under their KV head) with an additive padding bias;
* multi-token queries (prefill chunks) one by one with SDPA: a chunk starting at position 0
  uses its own K/V and a causal mask; a chunk continuing a cached prefix gathers its context and
  uses the shifted causal mask ``key_pos <= computed + query_index``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from tierserve.model.attention.base import (
    AttentionBackend,
    AttentionMetadata,
    BatchLayout,
    FreshPrompt,
    fresh_prefill,
    write_kv,
)


@dataclass
class ContinuedChunk:
    start: int  # rows [start, end) of the flat batch
    end: int
    slots: torch.Tensor  # context slots [L]
    mask: torch.Tensor  # [n, L] bool, True = attend


@dataclass
class TorchMetadata(AttentionMetadata):
    decode_rows: torch.Tensor | None = None  # [B] rows of single-token queries
    decode_blocks: torch.Tensor | None = None  # [B * blocks_max] block ids (padded with 0)
    decode_bias: torch.Tensor | None = None  # [B, 1, L_max] 0 = attend, -inf = padding
    fresh: list[FreshPrompt] = field(default_factory=list)
    chunks: list[ContinuedChunk] = field(default_factory=list)
    _decode_bias_heads: torch.Tensor | None = None  # built on first use, shared by the layers

    def to(self, device):
        super().to(device)
        for c in self.chunks:
            c.slots, c.mask = c.slots.to(device), c.mask.to(device)
        return self


def _gather(cache: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """cache [H, N, ...]; rows `index` of every head -> [H, len(index), ...], as one gather on
    the leading dimension of the [H * N, ...] view."""
    h, n = cache.shape[:2]
    flat = (torch.arange(h, device=index.device)[:, None] * n + index[None, :]).reshape(-1)
    return cache.flatten(0, 1).index_select(0, flat).view(h, index.numel(), *cache.shape[2:])


class TorchPagedAttention(AttentionBackend):
    name = "torch"

    def build(self, layout: BatchLayout, fused: bool = False) -> TorchMetadata:
        if fused:
            raise ValueError("the PyTorch attention backend has no fused layers")
        starts, counts, rows, bs = layout.starts, layout.counts, layout.rows, layout.block_size
        table = layout.tables.array
        t_rows = np.asarray(layout.table_rows)
        decode = counts == 1
        meta = TorchMetadata(self, layout.slot_mapping, all_cached=bool((starts > 0).all()))
        for i in np.flatnonzero(~decode).tolist():
            start, end, row = int(starts[i]), int(starts[i] + counts[i]), int(rows[i])
            if start == 0:
                meta.fresh.append(FreshPrompt(row, row + int(counts[i])))
                continue
            p = np.arange(end)
            ctx = table[t_rows[i], p // bs].astype(np.int64) * bs + p % bs
            mask = torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]
            meta.chunks.append(
                ContinuedChunk(row, row + int(counts[i]), torch.from_numpy(ctx), mask)
            )
        if decode.any():
            lens = torch.from_numpy(starts[decode] + 1)
            width = -(-int(lens.max()) // bs)
            tab = layout.tables.tensor[torch.from_numpy(t_rows[decode]), :width]
            meta.decode_rows = torch.from_numpy(rows[decode])
            meta.decode_blocks = tab.reshape(-1).long()
            pad = torch.arange(width * bs)[None, :] >= lens[:, None]
            bias = torch.zeros(pad.shape, dtype=layout.dtype).masked_fill_(pad, float("-inf"))
            meta.decode_bias = bias[:, None, :]  # [B, 1, L]
        return meta

    def _decode(self, q, k_cache, v_cache, meta: TorchMetadata) -> torch.Tensor:
        """Single-token queries q [B, H, D] against their paged contexts; returns [B, H, D]."""
        hkv, d = k_cache.shape[0], k_cache.shape[-1]
        b = q.shape[0]
        group = q.shape[1] // hkv
        if meta._decode_bias_heads is None:
            meta._decode_bias_heads = meta.decode_bias.repeat(hkv, 1, 1)  # [H_kv * B, 1, L]
        kd = _gather(k_cache, meta.decode_blocks).view(hkv * b, -1, d)
        vd = _gather(v_cache, meta.decode_blocks).view(hkv * b, -1, d)
        qd = q.reshape(b, hkv, group, d).transpose(0, 1).reshape(hkv * b, group, d)
        scores = torch.baddbmm(meta._decode_bias_heads, qd, kd.transpose(1, 2), alpha=d**-0.5)
        od = torch.bmm(scores.softmax(-1), vd)  # [H_kv * B, G, D]
        return od.view(hkv, b, group, d).transpose(0, 1).reshape(b, hkv * group, d)

    def forward(self, q, k, v, k_cache, v_cache, meta: TorchMetadata) -> torch.Tensor:
        hkv, nb, bs, d = k_cache.shape
        write_kv(k_cache, meta.slot_mapping, k)
        write_kv(v_cache, meta.slot_mapping, v)
        if meta.decode_rows is not None and meta.decode_rows.numel() == q.shape[0]:
            return self._decode(q, k_cache, v_cache, meta)
        out = q.new_empty(q.shape)
        if meta.decode_rows is not None:
            qd = q.index_select(0, meta.decode_rows)
            out.index_copy_(0, meta.decode_rows, self._decode(qd, k_cache, v_cache, meta))
        flat_k, flat_v = k_cache.view(hkv, nb * bs, d), v_cache.view(hkv, nb * bs, d)
        for p in meta.fresh:
            out[p.start : p.end] = fresh_prefill(q, k, v, p)
        for c in meta.chunks:
            qp = q[c.start : c.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
            kp = _gather(flat_k, c.slots).unsqueeze(0)
            vp = _gather(flat_v, c.slots).unsqueeze(0)
            op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=c.mask, enable_gqa=True)
            out[c.start : c.end] = op[0].transpose(0, 1)
        return out
