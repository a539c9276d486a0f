"""Paged attention over a mixed batch (prefill chunks and decode tokens together).

KV cache layout, per layer and for K and V alike::

    [kv_heads, num_blocks, block_size, head_dim]      token slot = block_id * block_size + offset

Head-major, so that gathering one request's blocks for one head is a ``index_select`` on the
leading dimension of a contiguous ``[num_blocks, block_size, head_dim]`` tensor (measured ~7x
faster on CPU than gathering along an inner dimension), and the gathered context of a batch lands
directly in the ``[kv_heads, batch, length, head_dim]`` layout the matmuls want, with no copy.

Each step first writes the new tokens' K/V into their slots (``slot_mapping``), then attends:

* single-token queries (decodes) together: their block tables (padded to the longest) gather one
  ``[kv_heads, B, L_max, head_dim]`` context; grouped-query attention is two batched matmuls
  (query heads grouped under their KV head) with an additive padding bias;
* multi-token queries (prefill chunks) one by one with SDPA: a chunk starting at position 0
  uses its own K/V and a causal mask; a chunk continuing a cached prefix gathers its context and
  uses the shifted causal mask ``key_pos <= computed + query_index``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F


@dataclass
class PrefillSeq:
    start: int  # rows [start, end) of the flat batch
    end: int
    slots: torch.Tensor | None  # context slots [L] when continuing a cached prefix
    mask: torch.Tensor | None  # [n, L] bool, True = attend


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] where each new token's K/V goes
    decode_rows: torch.Tensor | None = None  # [B] rows of single-token queries
    decode_blocks: torch.Tensor | None = None  # [B * blocks_max] block ids (padded with 0)
    decode_bias: torch.Tensor | None = None  # [B, 1, L_max] 0 = attend, -inf = padding
    all_decode: bool = False  # every row reads cached context: no row gathering needed
    prefills: list[PrefillSeq] = field(default_factory=list)
    # Kernel path: block tables [rows, width] int32 and segments [n, 4] int32 (row0, rows,
    # table row, context of the first row); see kernels/csrc/attention.cpp.
    tables: torch.Tensor | None = None
    segments: torch.Tensor | None = None
    # Built on first use, shared by every layer of the step.
    _decode_bias_heads: torch.Tensor | None = None


def _gather(cache: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """cache [H, N, ...]; rows `index` of every head -> [H, len(index), ...], as one gather on
    the leading dimension of the [H * N, ...] view."""
    h, n = cache.shape[:2]
    flat = (torch.arange(h, device=index.device)[:, None] * n + index[None, :]).reshape(-1)
    return cache.flatten(0, 1).index_select(0, flat).view(h, index.numel(), *cache.shape[2:])


def write_kv(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """cache [H, blocks, block_size, D]; x [T, H, D] written at token `slots` (one kernel)."""
    h, nb, bs, d = cache.shape
    cache.view(h, nb * bs, d).index_copy_(1, slots, x.transpose(0, 1))


def _decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
) -> torch.Tensor:
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


def _fresh_prefill(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, p: PrefillSeq
) -> torch.Tensor:
    """A chunk from position 0 attends causally to its own keys: SDPA, [n, H, D]."""
    qp = q[p.start : p.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
    kp = k[p.start : p.end].transpose(0, 1).unsqueeze(0)
    vp = v[p.start : p.end].transpose(0, 1).unsqueeze(0)
    op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=True)
    return op[0].transpose(0, 1)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    kernels=None,
) -> torch.Tensor:
    """q: [T, H, D]; k, v: [T, H_kv, D]. Writes k/v to the cache; returns [T, H, D].
    With `kernels` (the compiled module) and segment metadata, every row that reads cached
    context attends in one kernel call straight from the cache."""
    hkv, nb, bs, d = k_cache.shape
    write_kv(k_cache, meta.slot_mapping, k)
    write_kv(v_cache, meta.slot_mapping, v)
    if meta.segments is not None:
        out = q.new_empty(q.shape)
        if meta.segments.shape[0]:
            kernels.paged_attention_into(
                q, k_cache, v_cache, meta.tables, meta.segments, d**-0.5, out
            )
        for p in meta.prefills:
            out[p.start : p.end] = _fresh_prefill(q, k, v, p)
        return out
    if meta.all_decode:
        return _decode_attention(q, k_cache, v_cache, meta)
    out = q.new_empty(q.shape)
    if meta.decode_rows is not None:
        qd = q.index_select(0, meta.decode_rows)
        out.index_copy_(0, meta.decode_rows, _decode_attention(qd, k_cache, v_cache, meta))
    flat_k, flat_v = k_cache.view(hkv, nb * bs, d), v_cache.view(hkv, nb * bs, d)
    for p in meta.prefills:
        if p.slots is None:
            out[p.start : p.end] = _fresh_prefill(q, k, v, p)
            continue
        qp = q[p.start : p.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        kp = _gather(flat_k, p.slots).unsqueeze(0)
        vp = _gather(flat_v, p.slots).unsqueeze(0)
        op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=p.mask, enable_gqa=True)
        out[p.start : p.end] = op[0].transpose(0, 1)
    return out
