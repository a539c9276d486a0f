"""Turn a checkpoint's tensors into the model's layers, in the precision ``--quantization`` asks.

The loader hands over float32 tensors and, for a GGUF file, `QuantTensor`s in the file's own
block formats. `QuantPolicy` says what each linear weight becomes:

* ``auto``: the file's own precision (a GGUF's q8_0 / q4_0 / q4_1 weights run quantized, its
  float tensors and any Hugging Face folder in float32);
* ``none``: float32 everywhere (quantized weights are dequantized at load);
* ``q8_0`` / ``q4_0``: every linear weight requantized to that format with llama.cpp's
  reference rounding (`gguf.quants`); under ``q4_0`` the vocabulary head is q8_0, as llama.cpp's
  own q4_0 files keep their output layer at higher precision.

A fused group (q/k/v, gate/up) whose parts come in different formats, or a format the kernels do
not run (the K-quants, for now), is dequantized to float32. Quantized execution needs the
compiled kernels on a float32 CPU model; without them every weight is float32 (logged).
Norms, biases and rotary tables are always float32.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import torch

from tierserve.model import quant
from tierserve.model.config import QUANTIZATIONS
from tierserve.model.linear import DenseMethod, GGUFMethod, Linear

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class QuantPolicy:
    mode: str = "auto"

    def __post_init__(self) -> None:
        if self.mode not in QUANTIZATIONS:
            raise ValueError(
                f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {self.mode!r}"
            )

    def target(self, formats: set[str], head: bool) -> str:
        """The format a linear weight whose parts come in `formats` becomes."""
        if self.mode == "none":
            return "f32"
        if self.mode == "q8_0" or (self.mode == "q4_0" and head):
            return "q8_0"
        if self.mode == "q4_0":
            return "q4_0"
        if len(formats) == 1 and next(iter(formats)) in quant.FORMATS:
            return next(iter(formats))
        return "f32"


@dataclass
class Embedding:
    """Token ids -> rows of the embedding table, wherever the table lives."""

    table: torch.Tensor | None = None  # float32 [vocab, hidden]
    rows_q: quant.QuantTensor | None = None  # GGUF layout: one row per token
    tied: Linear | None = None  # the head [hidden, vocab]: a token's row is its column

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if self.table is not None:
            return torch.nn.functional.embedding(ids, self.table)
        if self.rows_q is not None:
            sub = self.rows_q.rows(ids.cpu().numpy())
            return quant.dequantize(sub).to(ids.device)
        return self.tied.columns(ids)


@dataclass
class WeightBuilder:
    weights: object  # dict or LazyWeights: name -> float tensor or QuantTensor; popped as used
    policy: QuantPolicy
    kernels: object  # the compiled module, or None
    device: torch.device
    dtype: torch.dtype
    activations: str = "float32"  # quantized kernels' products: float32, bfloat16, int8 or auto
    formats: Counter = field(default_factory=Counter)  # weight bytes by format, for the log

    def __post_init__(self) -> None:
        self.quantized_ok = (
            self.kernels is not None and self.device.type == "cpu" and self.dtype == torch.float32
        )
        if self.policy.mode not in ("auto", "none") and not self.quantized_ok:
            log.warning(
                "--quantization %s needs the compiled CPU kernels and a float32 CPU model; "
                "serving float32 weights",
                self.policy.mode,
            )
        # auto: int8 products where the CPU has AVX512_VNNI or AVX2 (VNNI: 1.5x faster lone decode
        # than bf16 at +0.6% perplexity; AVX2: 2-3x faster than float32 products at every row
        # count; docs/performance.md), else bf16 where it has AVX512_BF16.
        q = self.kernels.QWeight if self.quantized_ok else None
        self.int8 = q is not None and self.activations in ("int8", "auto") and q.int8_available()
        if self.activations == "int8" and q is not None and not self.int8:
            log.warning(
                "--activations int8 needs AVX512_VNNI or AVX2, which this CPU lacks: float32"
            )
        bf16_asked = self.activations == "bfloat16" or self.activations == "auto"
        self.bf16 = q is not None and not self.int8 and bf16_asked and q.bf16_available()
        self.dense = DenseMethod(self.kernels)
        self.gguf = GGUFMethod(self.kernels)

    def has(self, name: str) -> bool:
        return name in self.weights

    def pop(self, name: str):
        if name not in self.weights:
            raise KeyError(f"weight {name!r} missing from the checkpoint")
        return self.weights.pop(name)

    def dense_tensor(self, name: str) -> torch.Tensor:
        """A norm, bias or other small tensor: always in the model's dtype."""
        return _as_float(self.pop(name)).to(self.device, self.dtype)

    def linear(self, names: list[str], head: bool = False, bias: list[str] | None = None) -> Linear:
        """One `Linear` from the weights `names` stacked along their output dimension."""
        parts = [self.pop(n) for n in names]
        b = None
        if bias:
            b = torch.cat([self.dense_tensor(n) for n in bias])
        formats = {p.fmt if isinstance(p, quant.QuantTensor) else "f32" for p in parts}
        target = self.policy.target(formats, head) if self.quantized_ok else "f32"
        if target == "f32":
            w = torch.cat([_as_float(p) for p in parts]) if len(parts) > 1 else _as_float(parts[0])
            w_t = w.to(self.device, self.dtype).t().contiguous()
            del w, parts
            lin = Linear(self.dense, w_t=w_t, bias=b)
        else:
            if formats == {target}:
                qt = quant.cat_rows(parts) if len(parts) > 1 else parts[0]
            else:
                qt = quant.quantize(torch.cat([_as_float(p) for p in parts]), target)
            lin = Linear(self.gguf, packed=quant.pack(qt), bias=b, bf16=self.bf16, int8=self.int8)
        self.formats[lin.fmt] += lin.nbytes
        return lin

    def embedding(self, name: str, tied: Linear | None) -> Embedding:
        if tied is not None:
            return Embedding(tied=tied)
        t = self.pop(name)
        if isinstance(t, quant.QuantTensor) and self.policy.mode != "none":
            self.formats[t.fmt] += t.nbytes
            return Embedding(rows_q=t)
        table = _as_float(t).to(self.device, self.dtype)
        self.formats["embedding " + str(self.dtype).split(".")[-1]] += table.numel() * 4
        return Embedding(table=table)

    def summary(self) -> str:
        s = ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in sorted(self.formats.items()))
        products = "int8" if self.int8 else "bf16" if self.bf16 else None
        return s + (f" ({products} products)" if products and len(self.formats) > 0 else "")


def _as_float(t) -> torch.Tensor:
    if isinstance(t, quant.QuantTensor):
        return quant.dequantize(t)
    if isinstance(t, np.ndarray):
        return torch.from_numpy(t).float()
    return t.float() if t.dtype != torch.float32 else t
