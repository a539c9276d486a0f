"""Which code path runs a step of a given size (chosen by measurement: `model/autotune.py`).

* ``fused``: every row reads cached context and each decoder layer is one compiled call
  (`kernels/csrc/layer.cpp`), with the kernel GEMMs (float32 or quantized) inside;
* ``kernel``: op by op, kernel GEMMs and kernel attention;
* ``blas``: op by op, BLAS GEMMs (quantized weights dequantized into a scratch buffer first) and
  kernel attention;
* ``bf16``: op by op, BLAS GEMMs in bfloat16 (torch's oneDNN matmul, on AMX tiles: offered only
  where the CPU has them) against a bfloat16 copy of each layer's weights, made when the plan
  uses the path, and kernel attention; float32 activations between the GEMMs, the vocabulary
  head on the kernel (its rows are the few logits rows);
* ``mixed``: op by op, kernel GEMMs and PyTorch attention (for models whose attention the
  kernel does not cover: sliding windows, soft-capping, odd head sizes);
* ``torch``: the pure-PyTorch path (BLAS, PyTorch attention): the reference.

Without the compiled kernels every step runs ``torch``.
"""

from __future__ import annotations

from dataclasses import dataclass

PATHS = ("fused", "kernel", "blas", "bf16", "mixed", "torch")


def uses_blas(path: str) -> bool | str:
    """How the step's GEMMs run: False (the compiled kernels), True (BLAS in the weights'
    float32) or ``"bf16"`` (BLAS in bfloat16)."""
    if path == "bf16":
        return "bf16"
    return path in ("blas", "torch")


def uses_kernel_attention(path: str) -> bool:
    return path in ("fused", "kernel", "blas", "bf16")


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
