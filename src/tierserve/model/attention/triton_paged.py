"""The CUDA backend: the PyTorch backend's metadata, prefill and KV writes, with decodes run by
a Triton kernel of our own that reads each request's blocks in place (`triton_kernels.py`)
instead of gathering its context into a padded batch (30% of a batch-64 decode step on an H200
in the first GPU run). Chosen on CUDA where Triton imports (`TIERSERVE_TRITON=off`: the PyTorch
backend); the PyTorch backend stays the reference and the CPU path.

Graph-safe: the kernel's grid depends only on the batch's shape and the block tables' width
(a decode graph's buckets), never on the lengths, which it reads from a device tensor.
"""

from __future__ import annotations

import os

import torch

from tierserve.model.attention.base import AttentionSpec
from tierserve.model.attention.torch_paged import TorchMetadata, TorchPagedAttention

BLOCKS_PER_SPLIT = 16  # blocks of context one program reads (256 tokens at 16 a block)


def triton_available() -> bool:
    """Whether the Triton backend can run here (`TIERSERVE_TRITON=off` withholds it)."""
    if os.environ.get("TIERSERVE_TRITON", "").strip().lower() in ("off", "0", "false"):
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def paged_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    lens: torch.Tensor,
    spec: AttentionSpec,
    blocks_per_split: int = BLOCKS_PER_SPLIT,
) -> torch.Tensor:
    """Single-token queries `q` [B, H, D] against their paged contexts: `tables` [B, W] block
    ids, `lens` [B] context lengths (the query's own position included). Returns [B, H, D] in
    q's dtype."""
    from tierserve.model.attention.triton_kernels import _decode_split, _merge_splits

    b, h, d = q.shape
    hkv, _, bs, _ = k_cache.shape
    group = h // hkv
    width = tables.shape[1]
    per_split = min(blocks_per_split, width)
    splits = -(-width // per_split)
    q = q.contiguous()
    part = torch.empty((b, h, splits, d), dtype=torch.float32, device=q.device)
    m = torch.empty((b, h, splits), dtype=torch.float32, device=q.device)
    l_ = torch.empty_like(m)
    _decode_split[(b, hkv, splits)](
        q, k_cache, v_cache, tables, lens, part, m, l_,
        spec.scale_for(d), spec.softcap or 1.0, spec.window or 0,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        tables.stride(0),
        part.stride(0), part.stride(1), part.stride(2),
        m.stride(0), m.stride(1),
        GROUP=group, GROUP_P=max(_pow2(group), 1), HEAD_DIM=d, DIM_P=_pow2(d),
        BLOCK_SIZE=bs, BLOCKS_PER_SPLIT=per_split,
        HAS_WINDOW=spec.window is not None, HAS_SOFTCAP=spec.softcap is not None,
    )  # fmt: skip
    out = torch.empty((b, h, d), dtype=torch.float32, device=q.device)
    _merge_splits[(b, h)](
        part, m, l_, out,
        part.stride(0), part.stride(1), part.stride(2),
        m.stride(0), m.stride(1),
        out.stride(0), out.stride(1),
        SPLITS=splits, SPLITS_P=_pow2(splits), HEAD_DIM=d, DIM_P=_pow2(d),
    )  # fmt: skip
    return out.to(q.dtype)


class TritonPagedAttention(TorchPagedAttention):
    name = "triton"

    def _decode(self, q, k_cache, v_cache, meta: TorchMetadata, spec) -> torch.Tensor:
        b = q.shape[0]
        tables = meta.decode_blocks.view(b, -1)
        return paged_decode(q, k_cache, v_cache, tables, meta.decode_lens, spec)
