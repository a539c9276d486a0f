"""The pure-PyTorch backend (the reference, and the path on CUDA).

KV cache layout, per layer and for K and V alike::

    [kv_heads, num_blocks, block_size, head_dim]      token slot = block_id * block_size + offset

except that where the model has the compiled kernels, a K block holds its keys in tiles of VL
keys, dimension-major (their layout, `base.k_index`; `k_tile`): this backend writes and reads
keys there too, so that every step path of such a model shares one cache.

The cache may be narrower than the queries (a 16-bit cache, `--kv-cache-dtype`): what is
gathered is widened to the queries' dtype before the matmuls.

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

Every feature a layer's `AttentionSpec` asks for is here (this is the reference): any score
scale, sliding windows (a masked-out key is simply outside the window) and soft-capped scores.
The masks and biases of a window are built on first use in a step and shared by its layers.
"""

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
    attend,
    causal_mask,
    fresh_prefill,
    read_k,
    untile_k,
    write_kv,
)


@dataclass
class ContinuedChunk:
    start: int  # rows [start, end) of the flat batch
    end: int
    slots: torch.Tensor  # context slots [L]
    first: int  # position of the chunk's first query
    masks: dict = field(default_factory=dict)  # window -> [n, L] bool, True = attend

    def mask(self, window: int | None) -> torch.Tensor:
        if window not in self.masks:
            dev = self.slots.device
            q = torch.arange(self.first, self.first + self.end - self.start, device=dev)
            self.masks[window] = causal_mask(
                q, torch.arange(self.slots.numel(), device=dev), window
            )
        return self.masks[window]


@dataclass
class TorchMetadata(AttentionMetadata):
    decode_rows: torch.Tensor | None = None  # [B] rows of single-token queries
    decode_blocks: torch.Tensor | None = None  # [B * blocks_max] block ids (padded with 0)
    decode_lens: torch.Tensor | None = None  # [B] context length of each decode
    decode_width: int = 0  # L_max, the padded context length
    dtype: torch.dtype = torch.float32  # of the decode biases (the model's)
    fresh: list[FreshPrompt] = field(default_factory=list)
    chunks: list[ContinuedChunk] = field(default_factory=list)
    _bias: dict = field(default_factory=dict)  # (window, kv heads) -> [H_kv * B, 1, L_max]

    def to(self, device):
        super().to(device)
        for c in self.chunks:
            c.slots = c.slots.to(device)
        return self

    def decode_bias(self, window: int | None, kv_heads: int) -> torch.Tensor:
        """0 where a decode attends, -inf at padding and outside its window; one row per
        (kv head, decode), as the batched matmuls lay them out."""
        key = (window, kv_heads)
        if key not in self._bias:
            lens = self.decode_lens
            pos = torch.arange(self.decode_width, device=lens.device)[None, :]
            out = pos >= lens[:, None]
            if window is not None:
                out |= pos <= lens[:, None] - 1 - window
            bias = torch.zeros(out.shape, dtype=self.dtype, device=lens.device)
            bias = bias.masked_fill_(out, float("-inf"))[:, None, :]  # [B, 1, L]
            self._bias[key] = bias.repeat(kv_heads, 1, 1)
        return self._bias[key]


def _gather(cache: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """cache [H, N, ...]; rows `index` of every head -> [H, len(index), ...], as one gather on
    the leading dimension of the [H * N, ...] view."""
    h, n = cache.shape[:2]
    flat = (torch.arange(h, device=index.device)[:, None] * n + index[None, :]).reshape(-1)
    return cache.flatten(0, 1).index_select(0, flat).view(h, index.numel(), *cache.shape[2:])


class TorchPagedAttention(AttentionBackend):
    name = "torch"

    def __init__(self, k_tile: int = 0) -> None:
        self.k_tile = k_tile  # the compiled kernels' K tiles (where the block size takes them)

    def tile(self, block_size: int) -> int:
        return self.k_tile if self.k_tile and block_size % self.k_tile == 0 else 0

    def build(self, layout: BatchLayout, fused: bool = False) -> TorchMetadata:
        if fused:
            raise ValueError("the PyTorch attention backend has no fused layers")
        starts, counts, rows, bs = layout.starts, layout.counts, layout.rows, layout.block_size
        table = layout.tables.array
        t_rows = np.asarray(layout.table_rows)
        decode = counts == 1
        meta = TorchMetadata(
            self, layout.slot_mapping, all_cached=bool((starts > 0).all()), dtype=layout.dtype
        )
        for i in np.flatnonzero(~decode).tolist():
            start, end, row = int(starts[i]), int(starts[i] + counts[i]), int(rows[i])
            if start == 0:
                meta.fresh.append(FreshPrompt(row, row + int(counts[i])))
                continue
            p = np.arange(end)
            ctx = table[t_rows[i], p // bs].astype(np.int64) * bs + p % bs
            meta.chunks.append(
                ContinuedChunk(row, row + int(counts[i]), torch.from_numpy(ctx), start)
            )
        if decode.any():
            lens_np = starts[decode] + 1  # host data: no device read to size the tables
            lens = torch.from_numpy(lens_np)
            width = -(-int(lens_np.max()) // bs)
            tab = layout.tables.tensor[torch.from_numpy(t_rows[decode]), :width]
            meta.decode_rows = torch.from_numpy(rows[decode])
            meta.decode_blocks = tab.reshape(-1).long()
            meta.decode_lens, meta.decode_width = lens, width * bs
        return meta

    def _decode(self, q, k_cache, v_cache, meta: TorchMetadata, spec) -> torch.Tensor:
        """Single-token queries q [B, H, D] against their paged contexts; returns [B, H, D]."""
        hkv, d = k_cache.shape[0], k_cache.shape[-1]
        b = q.shape[0]
        group = q.shape[1] // hkv
        bias = meta.decode_bias(spec.window, hkv)  # [H_kv * B, 1, L]
        kd = _gather(k_cache, meta.decode_blocks)
        if tile := self.tile(k_cache.shape[2]):
            kd = untile_k(kd, tile)
        kd = kd.view(hkv * b, -1, d).to(q.dtype)
        vd = _gather(v_cache, meta.decode_blocks).view(hkv * b, -1, d).to(q.dtype)
        qd = q.reshape(b, hkv, group, d).transpose(0, 1).reshape(hkv * b, group, d)
        scale = spec.scale_for(d)
        if spec.softcap is None:
            scores = torch.baddbmm(bias, qd, kd.transpose(1, 2), alpha=scale)
        else:
            scores = torch.bmm(qd, kd.transpose(1, 2)).mul_(scale / spec.softcap).tanh_()
            scores = scores.mul_(spec.softcap).add_(bias)
        od = torch.bmm(scores.softmax(-1), vd)  # [H_kv * B, G, D]
        return od.view(hkv, b, group, d).transpose(0, 1).reshape(b, hkv * group, d)

    def forward(
        self, q, k, v, k_cache, v_cache, meta: TorchMetadata, spec: AttentionSpec = PLAIN
    ) -> torch.Tensor:
        hkv, nb, bs, d = k_cache.shape
        tile = self.tile(bs)
        write_kv(k_cache, meta.slot_mapping, k, tile)
        write_kv(v_cache, meta.slot_mapping, v)
        if meta.decode_rows is not None and meta.decode_rows.numel() == q.shape[0]:
            return self._decode(q, k_cache, v_cache, meta, spec)
        out = q.new_empty(q.shape)
        if meta.decode_rows is not None:
            qd = q.index_select(0, meta.decode_rows)
            out.index_copy_(0, meta.decode_rows, self._decode(qd, k_cache, v_cache, meta, spec))
        flat_k, flat_v = k_cache.view(hkv, nb * bs, d), v_cache.view(hkv, nb * bs, d)
        for p in meta.fresh:
            out[p.start : p.end] = fresh_prefill(q, k, v, p, spec, meta.fresh_dtype, k_cache.dtype)
        for c in meta.chunks:
            qp = q[c.start : c.end].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
            kp = read_k(k_cache, c.slots, tile) if tile else _gather(flat_k, c.slots)
            kp = kp.unsqueeze(0).to(q.dtype)
            vp = _gather(flat_v, c.slots).unsqueeze(0).to(q.dtype)
            out[c.start : c.end] = attend(qp, kp, vp, spec, c.mask(spec.window))[0].transpose(0, 1)
        return out
