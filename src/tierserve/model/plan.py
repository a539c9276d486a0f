"""Which code path runs a step of a given size (chosen by measurement: `model/autotune.py`).

* ``fused``: every row reads cached context and each decoder layer is one compiled call
  (`kernels/csrc/layer.cpp`), with the kernel GEMMs (float32 or quantized) inside;
* ``kernel``: op by op, kernel GEMMs and kernel attention;
* ``blas``: op by op, BLAS GEMMs (quantized weights dequantized into a scratch buffer first) and
  kernel attention;
* ``mixed``: op by op, kernel GEMMs and PyTorch attention (for models whose attention the
  kernel does not cover: sliding windows, soft-capping, odd head sizes);
* ``torch``: the pure-PyTorch path (BLAS, PyTorch attention): the reference.

Without the compiled kernels every step runs ``torch``.
"""

from __future__ import annotations

from dataclasses import dataclass

PATHS = ("fused", "kernel", "blas", "mixed", "torch")


def uses_blas(path: str) -> bool:
    """The step's GEMMs run through BLAS (else the compiled kernels)."""
    return path in ("blas", "torch")


def uses_kernel_attention(path: str) -> bool:
    return path in ("fused", "kernel", "blas")


NEVER = 1 << 62


@dataclass(frozen=True)
class StepPlan:
    """(max rows, path) pairs in ascending rows; the last one covers every larger step."""

    table: tuple[tuple[int, str], ...] = ((NEVER, "fused"),)
    source: str = "default"  # "default", "measured", or the cache file it was read from

    def __post_init__(self) -> None:
        for _, p in self.table:
            if p not in PATHS:
                raise ValueError(f"unknown step path {p!r} ({', '.join(PATHS)})")

    def path(self, rows: int) -> str:
        for limit, p in self.table:
            if rows <= limit:
                return p
        return self.table[-1][1]

    def describe(self) -> str:
        parts, lo = [], 1
        for limit, p in self.table:
            hi = "" if limit >= NEVER else str(limit)
            parts.append(f"{lo}-{hi} rows: {p}" if hi != str(lo) else f"{lo} rows: {p}")
            lo = limit + 1
        return "; ".join(parts)


TORCH_ONLY = StepPlan(((NEVER, "torch"),), "no kernels")
