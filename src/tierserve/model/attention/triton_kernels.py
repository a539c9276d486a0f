"""Paged decode attention in Triton: single-token queries read their K/V blocks where they lie in
the paged cache (no gather of the context), with a grid that does not depend on the data, so a
decode step can be captured in a CUDA graph (executor/graphs.py).

Cache layout (as the PyTorch backend's): per layer ``[kv_heads, num_blocks, block_size, D]``
for K and V. Grid ``(batch, kv_heads, splits)``: a program takes one request, one KV head with
the query heads of its group packed together (GQA: the K/V tile is read once for the group), and
one split of the context's blocks (split-K, so that a long context is shared by several
programs); it runs an online softmax over its blocks and writes its partial output with its
running max and sum. A second kernel merges the splits. Programs whose split lies past the
request's length write an empty partial (max -inf), so the grid is fixed by the block tables'
width, not by the lengths.

Imported only where Triton is (`triton_paged.py` decides); the tests run it under
``TRITON_INTERPRET=1`` on the CPU.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _decode_split(
    q_ptr, k_ptr, v_ptr, table_ptr, lens_ptr, out_ptr, m_ptr, l_ptr,
    scale, softcap, window,
    stride_qb, stride_qh,
    stride_kh, stride_kn, stride_ks,
    stride_tb,
    stride_ob, stride_oh, stride_os,
    stride_mb, stride_mh,
    GROUP: tl.constexpr, GROUP_P: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_P: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCKS_PER_SPLIT: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    length = tl.load(lens_ptr + b)
    g = tl.arange(0, GROUP_P)
    d = tl.arange(0, DIM_P)
    s = tl.arange(0, BLOCK_SIZE)
    g_ok = g < GROUP
    d_ok = d < HEAD_DIM
    heads = kvh * GROUP + g
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_ok[:, None] & d_ok[None, :],
        other=0.0,
    ).to(tl.float32)
    m_i = tl.full([GROUP_P], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, DIM_P], tl.float32)
    first = split * BLOCKS_PER_SPLIT
    lo = 0
    if HAS_WINDOW:
        lo = length - window  # keys at positions p > length - 1 - window are seen
    for i in range(BLOCKS_PER_SPLIT):
        blk_index = first + i
        pos = blk_index * BLOCK_SIZE + s
        live = (pos < length) & (pos >= lo)
        if blk_index * BLOCK_SIZE < length:
            blk = tl.load(table_ptr + b * stride_tb + blk_index).to(tl.int64)
            base = kvh * stride_kh + blk * stride_kn
            kv_off = base + s[:, None] * stride_ks + d[None, :]
            kv_mask = live[:, None] & d_ok[None, :]
            k = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
            v = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
            scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [G, BS]
            if HAS_SOFTCAP:
                scores = softcap * (1.0 - 2.0 / (tl.exp(2.0 * scores / softcap) + 1.0))
            scores = tl.where(live[None, :], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(scores - m_safe[:, None])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m_i = m_new
    o_off = b * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :]
    tl.store(out_ptr + o_off, acc, mask=g_ok[:, None] & d_ok[None, :])
    ml_off = b * stride_mb + heads * stride_mh + split
    tl.store(m_ptr + ml_off, m_i, mask=g_ok)
    tl.store(l_ptr + ml_off, l_i, mask=g_ok)


@triton.jit
def _merge_splits(
    part_ptr, m_ptr, l_ptr, out_ptr,
    stride_pb, stride_ph, stride_ps,
    stride_mb, stride_mh,
    stride_ob, stride_oh,
    SPLITS: tl.constexpr, SPLITS_P: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_P: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, SPLITS_P)
    d = tl.arange(0, DIM_P)
    sp_ok = sp < SPLITS
    m = tl.load(m_ptr + b * stride_mb + h * stride_mh + sp, mask=sp_ok, other=float("-inf"))
    l_ = tl.load(l_ptr + b * stride_mb + h * stride_mh + sp, mask=sp_ok, other=0.0)
    m_max = tl.max(m, axis=0)
    w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_max))
    total = tl.sum(w * l_, axis=0)
    part = tl.load(
        part_ptr + b * stride_pb + h * stride_ph + sp[:, None] * stride_ps + d[None, :],
        mask=sp_ok[:, None] & (d[None, :] < HEAD_DIM),
        other=0.0,
    )
    out = tl.sum(w[:, None] * part, axis=0) / total
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, out, mask=d < HEAD_DIM)
