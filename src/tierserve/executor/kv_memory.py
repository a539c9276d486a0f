"""KV cache memory: the zero-filled tensors a cache is made of, and what a block costs."""

from __future__ import annotations

import math
import mmap

import torch

from tierserve.model.base import CausalLM


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Zero-filled cache memory. On the CPU it is an anonymous memory map: resident only as it
    fills (a 1 GiB KV cache costs memory only for the blocks in use), and advised into
    transparent huge pages, because the first write into each fresh 4 KiB page is a page fault:
    measured here, a 2048-token prefill wrote its K/V 50x slower into fresh 4 KiB pages than into
    touched ones, and only 3-5x slower into fresh huge pages.
    (Zeros, not garbage, matter: masked attention slots are multiplied by 0, and 0 x NaN = NaN.)"""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    buf = mmap.mmap(-1, nbytes)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(buf, dtype=dtype).view(shape)


def kv_bytes_per_block(model: CausalLM, block_size: int) -> int:
    elem = torch.empty((), dtype=model.kv_dtype).element_size()
    per_layer = math.prod(model.kv_cache_shape(1, block_size))  # one block of K (or V)
    return 2 * model.config.num_layers * per_layer * elem


def blocks_for_gib(model: CausalLM, block_size: int, gib: float) -> int:
    return max(1, int(gib * (1 << 30)) // kv_bytes_per_block(model, block_size))


def allocate_caches(
    model: CausalLM, num_blocks: int, block_size: int, device: torch.device | None = None
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One (K, V) pair of `num_blocks` blocks per decoder layer, on `device` (default: the
    model's), in the model's KV dtype."""
    shape = model.kv_cache_shape(num_blocks, block_size)
    dev, dt = device or model.device, model.kv_dtype
    return [(zeros(shape, dt, dev), zeros(shape, dt, dev)) for _ in range(model.config.num_layers)]
