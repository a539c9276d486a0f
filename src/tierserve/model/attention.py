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
  (query heads grouped under their KV head) with a padding mask;
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
    decode_mask: torch.Tensor | None = None  # [1, B, 1, L_max] bool, True = attend
    prefills: list[PrefillSeq] = field(default_factory=list)


def _gather(cache: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """cache [H, N, ...]; index into dim 1 -> [H, len(index), ...], one leading-dim gather per
    head."""
    out = cache.new_empty((cache.shape[0], index.numel(), *cache.shape[2:]))
    for h in range(cache.shape[0]):
        torch.index_select(cache[h], 0, index, out=out[h])
    return out


def write_kv(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor) -> None:
    """cache [H, blocks, block_size, D]; x [T, H, D] written at token `slots`."""
    h, nb, bs, d = cache.shape
    flat = cache.view(h, nb * bs, d)
    for i in range(h):
        flat[i].index_copy_(0, slots, x[:, i])


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> torch.Tensor:
    """q: [T, H, D]; k, v: [T, H_kv, D]. Writes k/v to the cache; returns [T, H, D]."""
    hkv, nb, bs, d = k_cache.shape
    write_kv(k_cache, meta.slot_mapping, k)
    write_kv(v_cache, meta.slot_mapping, v)
    out = torch.empty_like(q)
    if meta.decode_rows is not None:
        b = meta.decode_rows.numel()
        group = q.shape[1] // hkv
        kd = _gather(k_cache, meta.decode_blocks).view(hkv, b, -1, d)  # [H_kv, B, L, D]
        vd = _gather(v_cache, meta.decode_blocks).view(hkv, b, -1, d)
        qd = q.index_select(0, meta.decode_rows).view(b, hkv, group, d).transpose(0, 1)
        scores = torch.matmul(qd, kd.transpose(-1, -2)) * (d**-0.5)  # [H_kv, B, G, L]
        scores = scores.masked_fill(~meta.decode_mask, float("-inf"))
        od = torch.matmul(scores.softmax(-1), vd)  # [H_kv, B, G, D]
        out.index_copy_(0, meta.decode_rows, od.transpose(0, 1).reshape(b, -1, d))
    for p in meta.prefills:
        qp = q[p.start : p.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
        if p.slots is None:
            kp = k[p.start : p.end].transpose(0, 1).unsqueeze(0)
            vp = v[p.start : p.end].transpose(0, 1).unsqueeze(0)
            op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=True)
        else:
            kp = _gather(k_cache.view(hkv, nb * bs, d), p.slots).unsqueeze(0)
            vp = _gather(v_cache.view(hkv, nb * bs, d), p.slots).unsqueeze(0)
            op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=p.mask, enable_gqa=True)
        out[p.start : p.end] = op[0].transpose(0, 1)
    return out
