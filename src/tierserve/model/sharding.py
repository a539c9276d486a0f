"""Tensor parallelism's split of a checkpoint (Megatron's): what rank `rank` of `size` holds.

* column-parallel (a slice of the output rows of an ``(out, in)`` weight, and of its bias):
  q, k, v (whole heads, so the KV cache splits by KV head), gate and up; a checkpoint's fused
  ``qkv_proj`` / ``gate_up_proj`` is cut into its parts first, each part sliced;
* row-parallel (a slice of the input columns): o and down, whose partial products the model
  sums with one all-reduce each (`model/decoder.py`); their bias is rank 0's alone;
* vocabulary-parallel: the embedding table and the head, ``ceil(vocab / size)`` rows per rank
  (the last padded with zero rows); the model sums the embedding lookups and gathers the logits;
* everything else (norms, q/k norms of one head's width) on every rank.

`ShardedWeights` is a view over the loader's weights (a dict or `LazyWeights`) that hands out
each rank's part as the model pops it; GGUF block weights are cut along whole 32-weight blocks
where the slice allows, else dequantized first (logged). `shard_config` is the per-rank shape
the model is built with; a head or width count the size does not divide is an error naming it.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch

from tierserve.model import quant
from tierserve.model.config import ModelConfig

log = logging.getLogger(__name__)

COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW = ("o_proj", "down_proj")
VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


class ShardingError(ValueError):
    """The model cannot be split `size` ways (names the count that does not divide)."""


def check_divisible(config: ModelConfig, size: int) -> None:
    if size < 1:
        raise ShardingError(f"--tensor-parallel-size must be at least 1, got {size}")
    for what, n in (
        ("attention heads", config.num_heads),
        ("KV heads", config.num_kv_heads),
        ("MLP width (intermediate_size)", config.intermediate_size),
    ):
        if n % size:
            raise ShardingError(
                f"--tensor-parallel-size {size}: the model's {n} {what} do not divide by {size}"
            )


def shard_config(config: ModelConfig, size: int) -> ModelConfig:
    """The shape one rank computes: its heads, KV heads and MLP width (the vocabulary stays
    whole: logits are gathered before sampling)."""
    check_divisible(config, size)
    if size == 1:
        return config
    return dataclasses.replace(
        config,
        num_heads=config.num_heads // size,
        num_kv_heads=config.num_kv_heads // size,
        intermediate_size=config.intermediate_size // size,
    )


def vocab_per_rank(vocab: int, size: int) -> int:
    return -(-vocab // size)


class ShardedWeights:
    """Rank `rank`'s part of `weights` (see the module docstring), popped as the model asks."""

    def __init__(self, weights, config: ModelConfig, rank: int, size: int) -> None:
        self.weights = weights
        self.config = config  # the whole model's shape
        self.rank = rank
        self.size = size

    def __contains__(self, name: str) -> bool:
        if self.rank and _kind(name) == "row" and name.endswith(".bias"):
            return False  # a row-parallel bias is added once, by rank 0
        return name in self.weights

    def keys(self):
        return [k for k in self.weights.keys() if k in self]  # noqa: SIM118

    def pop(self, name: str):
        t = self.weights.pop(name)
        kind = _kind(name)
        if kind is None:
            return t
        c, r, n = self.config, self.rank, self.size
        if kind == "column":
            return _rows(t, r, n)
        if kind == "row":
            return _cols(t, r, n, name)
        if kind == "vocab":
            per = vocab_per_rank(t.shape[0], n)
            return _vocab_rows(t, r * per, per)
        if kind == "qkv":
            sizes = (c.q_size, c.kv_size, c.kv_size)
        else:  # gate_up
            sizes = (c.intermediate_size, c.intermediate_size)
        return _cat([_rows(p, r, n) for p in _split_rows(t, sizes)])


def _kind(name: str) -> str | None:
    if name in VOCAB:
        return "vocab"
    parts = name.split(".")
    if len(parts) < 2:
        return None
    proj = parts[-2]
    if proj in COLUMN:
        return "column"
    if proj in ROW:
        return "row"
    if proj == "qkv_proj":
        return "qkv"
    if proj == "gate_up_proj":
        return "gate_up"
    return None


def _rows(t, rank: int, size: int):
    n = t.shape[0] // size
    return _row_range(t, rank * n, (rank + 1) * n)


def _row_range(t, start: int, stop: int):
    if isinstance(t, quant.QuantTensor):
        return t.rows(np.arange(start, stop))
    if isinstance(t, np.ndarray):
        return np.ascontiguousarray(t[start:stop])
    return t[start:stop].clone()  # not a view: the whole tensor is freed


def _split_rows(t, sizes: tuple[int, ...]) -> list:
    out, start = [], 0
    for s in sizes:
        out.append(_row_range(t, start, start + s))
        start += s
    return out


def _cat(parts: list):
    if isinstance(parts[0], quant.QuantTensor):
        return quant.cat_rows(parts)
    if isinstance(parts[0], np.ndarray):
        return np.concatenate(parts)
    return torch.cat(parts)


def _cols(t, rank: int, size: int, name: str):
    if len(t.shape) == 1:  # rank 0's row-parallel bias, whole
        return t
    k = t.shape[1] // size
    start, stop = rank * k, (rank + 1) * k
    if isinstance(t, quant.QuantTensor):
        if k % quant.BLOCK == 0:
            return t.cols(start, stop)
        log.warning(
            "%s: %d input columns per rank is not a multiple of %d-weight blocks: float32",
            name,
            k,
            quant.BLOCK,
        )
        t = quant.dequantize(t)
    if isinstance(t, np.ndarray):
        return np.ascontiguousarray(t[:, start:stop])
    return t[:, start:stop].contiguous()


def _vocab_rows(t, start: int, per: int):
    stop = min(start + per, t.shape[0])
    part = _row_range(t, start, stop)
    missing = per - (stop - start)
    if missing <= 0:
        return part
    if isinstance(part, quant.QuantTensor):
        pad = np.zeros((missing, part.blocks.shape[1]), dtype=part.blocks.dtype)
        return quant.QuantTensor(part.fmt, (per, part.shape[1]), np.concatenate([part.blocks, pad]))
    if isinstance(part, np.ndarray):
        return np.concatenate([part, np.zeros((missing, *part.shape[1:]), part.dtype)])
    return torch.cat([part, part.new_zeros((missing, *part.shape[1:]))])
