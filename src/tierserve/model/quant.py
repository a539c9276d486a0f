"""Weights in the GGUF block formats tierserve executes directly: q8_0, q4_0 and q4_1.

A `QuantTensor` is a 2-D weight ``(out, in)`` kept exactly as a GGUF file stores it (rows of
32-weight blocks along ``in``). `pack` turns it into the layout of the compiled kernels
(`kernels/csrc/qgemm.cpp`): K-major, with fp16 scales (and q4 mins) per (block, column), so that
a column tile reads consecutive bytes of each k row:

* q8_0 (34-byte blocks: fp16 d, 32 x int8 q; w = d q):   q int8 [K, N], d [K/32, N]
* q4_0 (18 bytes: fp16 d, 16 bytes of nibbles; w = d (q - 8)) and
  q4_1 (20 bytes: fp16 d, fp16 m, 16 bytes; w = d q + m): q uint8 [K/2, N] with GGUF's own
  nibble pairs (byte j of a block holds weights j and j + 16), d and m [K/32, N] fp16; q4_0
  becomes m = -8 d, exact in fp16 (a power-of-two multiple).

Nothing here needs the kernels: `dequantize` is the float32 reference (gguf's own reader), and
`quantize` (gguf's reference quantizers) makes q8_0 / q4_0 weights from float32 ones for
``--quantization q8_0|q4_0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

BLOCK = 32
FORMATS = ("q8_0", "q4_0", "q4_1")
_BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q4_1": 20}
KERNEL_FORMAT = {"f32": 0, "q8_0": 1, "q4_0": 2, "q4_1": 2}  # qweight.h: kF32, kQ8, kQ4


def _ggml_type(fmt: str):
    import gguf

    return {
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
        "q4_0": gguf.GGMLQuantizationType.Q4_0,
        "q4_1": gguf.GGMLQuantizationType.Q4_1,
    }[fmt]


@dataclass(frozen=True)
class QuantTensor:
    """A weight (out N, in K) in a GGUF block format: `blocks` is uint8 [N, K / 32 * bytes]."""

    fmt: str
    shape: tuple[int, int]
    blocks: np.ndarray

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"unsupported quantized format {self.fmt!r} ({', '.join(FORMATS)})")
        n, k = self.shape
        if k % BLOCK or self.blocks.shape != (n, k // BLOCK * _BLOCK_BYTES[self.fmt]):
            raise ValueError(
                f"{self.fmt} weight {self.shape}: blocks {self.blocks.shape} do not fit"
            )

    @property
    def nbytes(self) -> int:
        return self.blocks.nbytes

    def rows(self, index: np.ndarray) -> QuantTensor:
        """Output rows `index` (e.g. undoing llama.cpp's rope permutation of q and k)."""
        return QuantTensor(self.fmt, (len(index), self.shape[1]), self.blocks[index])

    def cols(self, start: int, stop: int) -> QuantTensor:
        """Input columns [start, stop), on block boundaries (a row-parallel shard)."""
        if start % BLOCK or stop % BLOCK:
            raise ValueError(f"cols({start}, {stop}): not on {BLOCK}-weight block boundaries")
        b = _BLOCK_BYTES[self.fmt]
        part = self.blocks[:, start // BLOCK * b : stop // BLOCK * b]
        return QuantTensor(self.fmt, (self.shape[0], stop - start), np.ascontiguousarray(part))


def cat_rows(parts: list[QuantTensor]) -> QuantTensor:
    """Stack weights of one format along the output dimension (fused q/k/v, gate/up)."""
    fmt, k = parts[0].fmt, parts[0].shape[1]
    if any(p.fmt != fmt or p.shape[1] != k for p in parts):
        raise ValueError("cat_rows: parts differ in format or input size")
    blocks = np.concatenate([p.blocks for p in parts], axis=0)
    return QuantTensor(fmt, (blocks.shape[0], k), blocks)


def dequantize(t: QuantTensor) -> torch.Tensor:
    """float32 (out, in): the reference every quantized path is tested against."""
    from gguf import quants

    arr = quants.dequantize(t.blocks, _ggml_type(t.fmt)).astype(np.float32, copy=False)
    return torch.from_numpy(np.ascontiguousarray(arr).reshape(t.shape))


def quantize(w: torch.Tensor, fmt: str) -> QuantTensor:
    """float32 (out, in) -> `fmt`, with gguf's reference quantizers (llama.cpp's rounding)."""
    from gguf import quants

    if fmt not in FORMATS:
        raise ValueError(f"cannot quantize to {fmt!r} ({', '.join(FORMATS)})")
    arr = w.detach().float().contiguous().numpy()
    blocks = quants.quantize(arr, _ggml_type(fmt))
    return QuantTensor(fmt, tuple(w.shape), np.ascontiguousarray(blocks))


@dataclass(frozen=True)
class Packed:
    """Kernel layout tensors (see the module docstring); `m` only for q4."""

    fmt: str
    q: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor | None

    @property
    def shape_kn(self) -> tuple[int, int]:
        n = self.q.shape[1]
        return (self.q.shape[0] * (2 if self.m is not None else 1), n)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.d, self.m) if t is not None)


def pack(t: QuantTensor) -> Packed:
    n, k = t.shape
    nb = k // BLOCK
    raw = t.blocks.reshape(n, nb, _BLOCK_BYTES[t.fmt])
    d = raw[:, :, 0:2].copy().view(np.float16).reshape(n, nb)
    if t.fmt == "q8_0":
        q = raw[:, :, 2:].view(np.int8).reshape(n, k)
        return Packed(t.fmt, _t(q), _t(d), None)
    if t.fmt == "q4_1":
        m = raw[:, :, 2:4].copy().view(np.float16).reshape(n, nb)
        qs = raw[:, :, 4:]
    else:
        m = (d.astype(np.float32) * -8.0).astype(np.float16)  # exact: d * 2^3
        qs = raw[:, :, 2:]
    return Packed(t.fmt, _t(qs.reshape(n, nb * 16)), _t(d), _t(m))


def _t(a: np.ndarray) -> torch.Tensor:
    """(N, X) numpy -> (X, N) contiguous torch (K-major)."""
    return torch.from_numpy(np.ascontiguousarray(a.T))


def unpack_reference(p: Packed) -> torch.Tensor:
    """float32 [K, N] from the kernel layout, in plain PyTorch (the parity tests' reference for
    `pack` and for the kernels' own dequantization)."""
    d = p.d.float().repeat_interleave(BLOCK, 0)
    if p.m is None:
        return p.q.float() * d
    kh, n = p.q.shape
    lo, hi = (p.q & 15).float(), (p.q >> 4).float()
    # byte row 16 b + j: low nibble is k = 32 b + j, high nibble k = 32 b + 16 + j
    q = torch.stack([lo.view(kh // 16, 16, n), hi.view(kh // 16, 16, n)], 1).reshape(2 * kh, n)
    return q * d + p.m.float().repeat_interleave(BLOCK, 0)
