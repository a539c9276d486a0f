"""Linear layers and the methods that run them (in the manner of vLLM's ``LinearMethodBase``).

A `Linear` holds one weight in the storage its method wants and computes ``x @ W (+ bias)`` or
adds it into a residual. The model never branches on precision: the loader picks a
`LinearMethod` per weight (`QuantPolicy`, ``--quantization``) and the layer calls it.

* `DenseMethod`: the weight in the model's dtype, ``[in, out]``; on a float32 CPU model the
  compiled GEMM kernel, or BLAS (``torch.mm``); BLAS without the kernels (the reference path).
* `GGUFMethod`: the weight in its GGUF block format (q8_0, q4_0, q4_1; `model/quant.py`),
  multiplied by the compiled quantized kernel with float32 activations, or dequantized into a
  scratch buffer and multiplied by BLAS.

Either can also run in bfloat16 through BLAS (``blas="bf16"``, the ``bf16`` step path, offered on
CPUs with AMX tiles): against a bfloat16 copy of the weight (`Linear.make_bf16`, made only when
the plan uses that path), float32 activations rounded to bfloat16 on the way in and the
(bfloat16) product widened on the way out.

Which a step uses is the step's path (`model/plan.py`), measured per step size on the
machine at first start (`model/autotune.py`).
Every kernel weight is also a ``kernels.QWeight``, which the fused decoder layer takes as is.
"""

from __future__ import annotations

import torch

from tierserve.model import quant


class LinearMethod:
    name = "base"

    def __init__(self, kernels) -> None:
        self.kernels = kernels

    def apply(self, lin: Linear, x: torch.Tensor, out: torch.Tensor | None, add: bool, blas):
        """x @ W (+ bias), or out += x @ W with `add`; `blas`: through BLAS in float32, not the
        kernel (``"bf16"`` never reaches a method: `Linear` runs it, the same for every one)."""
        raise NotImplementedError


class DenseMethod(LinearMethod):
    name = "dense"

    def apply(self, lin, x, out, add, blas):
        if lin.kernel_weight is not None and not blas:
            if out is None:
                out = x.new_empty((x.shape[0], lin.out_features))
            self.kernels.weight_linear_into(x, lin.kernel_weight, lin.bias, out, add)
            return out
        if add:  # out += x @ W (the residual), in out's memory
            return out.addmm_(x, lin.w_t)
        if lin.bias is not None:
            return torch.addmm(lin.bias, x, lin.w_t)
        return torch.mm(x, lin.w_t)


class GGUFMethod(LinearMethod):
    name = "gguf"

    def apply(self, lin, x, out, add, blas):
        if blas:
            w_t = x.new_empty((lin.in_features, lin.out_features))
            self.kernels.dequantize_into(lin.kernel_weight, w_t)
            if add:
                return out.addmm_(x, w_t)
            return torch.mm(x, w_t) if lin.bias is None else torch.addmm(lin.bias, x, w_t)
        if out is None:
            out = x.new_empty((x.shape[0], lin.out_features))
        self.kernels.weight_linear_into(x, lin.kernel_weight, lin.bias, out, add)
        return out


class Linear:
    """``y = x @ W (+ bias)`` with W of shape (in, out) held as its method wants it."""

    def __init__(
        self,
        method: LinearMethod,
        w_t: torch.Tensor | None = None,  # [in, out] in the model's dtype
        packed: quant.Packed | None = None,
        bias: torch.Tensor | None = None,
        bf16: bool = False,  # quantized kernels: bf16 products, float32 sums (AVX512_BF16)
        int8: bool = False,  # quantized kernels: int8 activations, integer products (VNNI)
    ) -> None:
        self.method = method
        self.w_t = w_t
        self.packed = packed
        self.bias = bias
        self.kernel_weight = None
        self.bf16_t: torch.Tensor | None = None  # [in, out] bfloat16 copy for the bf16 path
        k = method.kernels
        if packed is not None:
            self.in_features, self.out_features = packed.shape_kn
            self.fmt = packed.fmt
            fmt = quant.KERNEL_FORMAT[packed.fmt]
            self.kernel_weight = k.QWeight(fmt, packed.q, packed.d, packed.m, bf16, int8)
            if self.kernel_weight.released:  # int8: only the kernel's repacked copy is kept
                self.packed = None
        else:
            self.in_features, self.out_features = w_t.shape
            self.fmt = "f32" if w_t.dtype == torch.float32 else str(w_t.dtype).split(".")[-1]
            if k is not None and w_t.device.type == "cpu" and w_t.dtype == torch.float32:
                self.kernel_weight = k.QWeight(0, w_t)

    def make_bf16(self) -> torch.Tensor:
        """The bfloat16 copy of W the ``bf16`` path multiplies by (made once)."""
        if self.bf16_t is None:
            self.bf16_t = self.dequantized_t().to(torch.bfloat16)
        return self.bf16_t

    def drop_bf16(self) -> None:
        self.bf16_t = None

    def _bf16(self, x: torch.Tensor, widen: bool) -> torch.Tensor:
        y = torch.mm(x.to(torch.bfloat16), self.make_bf16())
        if self.bias is not None:
            return y.float().add_(self.bias)
        return y.float() if widen else y

    def __call__(self, x: torch.Tensor, blas: bool | str = False, widen=True) -> torch.Tensor:
        """x @ W (+ bias); `widen` False: the bf16 path's product stays bfloat16 (for a GEMM
        next, as the MLP's gated activation is)."""
        if blas == "bf16":
            return self._bf16(x, widen)
        return self.method.apply(self, x, None, False, blas)

    def add_into(self, out: torch.Tensor, x: torch.Tensor, blas: bool | str = False):
        """out += x @ W, in out's memory (the residual stream)."""
        if blas == "bf16":
            return out.add_(self._bf16(x, widen=False))
        return self.method.apply(self, x, out, True, blas)

    @property
    def quantized(self) -> bool:
        return self.w_t is None

    @property
    def nbytes(self) -> int:
        if self.packed is not None:
            return self.packed.nbytes
        if self.quantized:
            return self.kernel_weight.nbytes
        return self.w_t.numel() * self.w_t.element_size()

    def dequantized_t(self) -> torch.Tensor:
        """The weight as float32 [in, out] (a copy for quantized weights)."""
        if not self.quantized:
            return self.w_t
        if self.packed is None:
            out = torch.empty(self.in_features, self.out_features)
            self.method.kernels.dequantize_into(self.kernel_weight, out)
            return out
        return quant.unpack_reference(self.packed)

    def columns(self, ids: torch.Tensor) -> torch.Tensor:
        """Columns `ids` of W as float32 rows [len(ids), in]: the tied embedding's lookup."""
        if not self.quantized:
            return self.w_t.index_select(1, ids).t().contiguous()
        if self.packed is None:
            out = torch.empty(len(ids), self.in_features)
            self.method.kernels.columns_into(self.kernel_weight, ids.long().contiguous(), out)
            return out
        p = self.packed
        sub = quant.Packed(
            p.fmt,
            p.q.index_select(1, ids),
            p.d.index_select(1, ids),
            None if p.m is None else p.m.index_select(1, ids),
        )
        return quant.unpack_reference(sub).t().contiguous()
