"""The attention backend interface, what a layer asks of attention (`AttentionSpec`), and the
backend-neutral description of a step's batch."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class AttentionSpec:
    """What one layer asks of attention beyond plain causal GQA (each architecture sets its own,
    per layer): the score scale (None: 1/sqrt(head_dim)), a sliding window (a query at position
    p sees keys p - window < k <= p, as transformers masks it) and tanh soft-capping of the
    scores (``cap * tanh(s / cap)``, before the mask)."""

    scale: float | None = None
    window: int | None = None
    softcap: float | None = None

    def scale_for(self, head_dim: int) -> float:
        return head_dim**-0.5 if self.scale is None else self.scale

    def plain(self, head_dim: int) -> bool:
        """Plain causal attention scaled by 1/sqrt(head_dim) (what the fused layer runs)."""
        return (
            self.window is None
            and self.softcap is None
            and self.scale_for(head_dim) == (head_dim**-0.5)
        )


PLAIN = AttentionSpec()


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
    # Fresh chunks' attention (SDPA) in this dtype, else the queries' (the bf16 path: bfloat16,
    # 2.7x faster than float32 at 512 rows on AMX); the KV cache keeps its own dtype.
    fresh_dtype: torch.dtype | None = None

    def to(self, device: torch.device) -> AttentionMetadata:
        """A copy of the tensors on `device` (the batch is built on the CPU)."""
        for name, value in list(vars(self).items()):
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.to(device, non_blocking=True))
        return self


class AttentionBackend:
    name = "base"

    def supports(self, spec: AttentionSpec, group: int, head_dim: int, block_size: int) -> bool:
        """Whether this backend runs attention `spec` for heads of this shape."""
        return True

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
        spec: AttentionSpec = PLAIN,
    ) -> torch.Tensor:
        """Writes k/v to the cache at `meta.slot_mapping`; returns the attention output."""
        raise NotImplementedError


@dataclass
class FreshPrompt:
    """Rows [start, end) of a chunk from position 0: it attends causally to its own keys."""

    start: int
    end: int


def causal_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """[n, L] bool, True = attend: keys at or before each query, and within its window."""
    mask = k_pos[None, :] <= q_pos[:, None]
    if window is not None:
        mask &= k_pos[None, :] > q_pos[:, None] - window
    return mask


def attend(qp, kp, vp, spec: AttentionSpec, mask: torch.Tensor | None) -> torch.Tensor:
    """[1, H, n, D] queries over [1, H_kv, L, D] keys and values; `mask` [n, L] (True = attend)
    or None for plain causal attention over the queries' own keys. SDPA where it applies;
    soft-capped scores are computed in full (SDPA has no cap)."""
    scale = spec.scale_for(qp.shape[-1])
    if spec.softcap is None:
        return torch.nn.functional.scaled_dot_product_attention(
            qp, kp, vp, attn_mask=mask, is_causal=mask is None, scale=scale, enable_gqa=True
        )
    group = qp.shape[1] // kp.shape[1]
    kp, vp = kp.repeat_interleave(group, 1), vp.repeat_interleave(group, 1)
    s = torch.matmul(qp, kp.transpose(-1, -2)).mul_(scale)
    s = s.div_(spec.softcap).tanh_().mul_(spec.softcap)
    if mask is None:
        n = qp.shape[2]
        mask = torch.ones(n, n, dtype=torch.bool, device=qp.device).tril_()
    s = s.masked_fill_(~mask, float("-inf"))
    return torch.matmul(s.softmax(-1), vp)


def fresh_prefill(
    q,
    k,
    v,
    p: FreshPrompt,
    spec: AttentionSpec = PLAIN,
    dtype: torch.dtype | None = None,
    cache_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Attention of a chunk from position 0 over its own keys, [n, H, D] (computed in `dtype`
    where given, returned in q's). With a cache of another dtype than k (`cache_dtype`, a
    16-bit KV cache) the keys and values are rounded to it first: the chunk attends to what
    the cache holds, as its prompt's later chunks, its decodes and a prefix-cache hit on it
    do."""
    qp, kp, vp = (t[p.start : p.end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))
    if cache_dtype is not None and cache_dtype != k.dtype:
        kp, vp = (t.to(cache_dtype).to(k.dtype) for t in (kp, vp))
    if dtype is not None and dtype != q.dtype:  # [1, H, n, D]
        qp, kp, vp = (t.to(dtype) for t in (qp, kp, vp))
    mask = None
    if spec.window is not None and spec.window < p.end - p.start:
        pos = torch.arange(p.end - p.start, device=q.device)
        mask = causal_mask(pos, pos, spec.window)
    return attend(qp, kp, vp, spec, mask)[0].transpose(0, 1).to(q.dtype)


def k_index(slots: torch.Tensor, block_size: int, dim: int, tile: int) -> torch.Tensor:
    """[T, dim] element offsets, in one head's flat K cache, of the keys at token `slots` when
    the cache holds each block as tiles of `tile` keys, dimension-major (the compiled kernels'
    layout, kernels/csrc/attention.cpp): key u of a block, dimension d, at
    ``((u // tile) * dim + d) * tile + u % tile``."""
    u = slots % block_size
    base = (slots - u) * dim + (u // tile) * (dim * tile) + u % tile
    return base[:, None] + torch.arange(dim, device=slots.device)[None, :] * tile


def write_kv(cache: torch.Tensor, slots: torch.Tensor, x: torch.Tensor, tile: int = 0) -> None:
    """cache [H, blocks, block_size, D]; x [T, H, D] written at token `slots` (one kernel),
    rounded to the cache's dtype (to nearest even, as the compiled layer rounds) if narrower;
    `tile`: keys in K tiles of that many keys (`k_index`), else one row per token."""
    h, nb, bs, d = cache.shape
    x = x.transpose(0, 1).to(cache.dtype)
    if tile:
        cache.view(h, -1).index_copy_(1, k_index(slots, bs, d, tile).reshape(-1), x.reshape(h, -1))
    else:
        cache.view(h, nb * bs, d).index_copy_(1, slots, x)


def read_k(cache: torch.Tensor, slots: torch.Tensor, tile: int) -> torch.Tensor:
    """The keys at token `slots` of a K cache in tiles of `tile` keys: [H, len(slots), D]."""
    h, _, bs, d = cache.shape
    idx = k_index(slots, bs, d, tile).reshape(-1)
    return cache.view(h, -1).index_select(1, idx).view(h, slots.numel(), d)


def tile_k(blocks: torch.Tensor, tile: int) -> torch.Tensor:
    """Whole K blocks [H, n, block_size, D] of one row per key, as stored in tiles of `tile`
    keys (a copy; `untile_k`'s inverse)."""
    h, n, bs, d = blocks.shape
    return blocks.view(h, n, bs // tile, tile, d).transpose(-1, -2).contiguous().view(h, n, bs, d)


def untile_k(blocks: torch.Tensor, tile: int) -> torch.Tensor:
    """Whole K blocks [H, n, block_size, D] as stored in tiles of `tile` keys, one row per key
    (a copy)."""
    h, n, bs, d = blocks.shape
    return blocks.view(h, n, bs // tile, d, tile).transpose(-1, -2).contiguous().view(h, n, bs, d)
