"""`CausalLM`: everything the executor (`executor/torch_executor.py`) and the step-path
autotune (`executor/autotune.py`) know of a model. Neither names an architecture: the engine
builder asks the registry (`model/registry.py`) for the model of a checkpoint, and every
architecture is a `CausalLM`, most of them through the shared decoder (`model/decoder.py`).

The contract:

* ``forward(input_ids, positions, meta, kv_caches, logits_rows, hidden_rows, blas)``: one step
  over a flat mixed batch; float32 logits of `logits_rows` (and, with `hidden_rows`, those rows'
  final hidden states for ``head``);
* ``head(hidden, blas)``: float32 logits of final hidden states (prompt log-probs);
* ``paths(block_size)`` / ``default_plan(block_size)``: the step paths this model can run here
  (`model/plan.py`), and the plan before measurement; ``backend(path)``: the attention backend
  that builds a step's metadata for that path;
* ``use_plan(plan)``: told the executor's plan once it is known (a model may make or free what
  a path needs: the decoder's bfloat16 weight copies for ``bf16``);
* ``kv_cache_shape(num_blocks, block_size)``: one layer's K (or V) cache, of ``kv_dtype``
  (the model's dtype unless the engine sets a 16-bit cache, `--kv-cache-dtype`);
* ``weight_bytes()``, ``weights_summary``, ``config``, ``kernels``, ``dtype``, ``device``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch

from tierserve import kernels as _kernels
from tierserve.model.attention import (
    AttentionBackend,
    AttentionMetadata,
    KernelPagedAttention,
    TorchPagedAttention,
)
from tierserve.model.config import ModelConfig
from tierserve.model.plan import NEVER, PATHS, TORCH_ONLY, StepPlan, uses_kernel_attention


def amx_available() -> bool:
    """torch's CPU matmuls can run on AMX tiles here (the CPU has them and the kernel lets
    them be used): the only CPUs where the ``bf16`` path is offered. `TIERSERVE_BF16_PATH=off`
    withholds it."""
    import os

    if os.environ.get("TIERSERVE_BF16_PATH", "on").strip().lower() == "off":
        return False
    try:
        return bool(torch.cpu._is_amx_tile_supported()) and torch.backends.mkldnn.is_available()
    except (AttributeError, RuntimeError):
        return False


class CausalLM(ABC):
    weights_summary: str = ""
    bf16_gemms = False  # the `bf16` path is offered (`use_plan` makes its weight copies)

    def __init__(
        self,
        config: ModelConfig,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        kernels: bool | None = None,  # None: use them where they apply and load
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self.dtype = dtype
        # The KV cache's element type: the model's, or a 16-bit one the engine sets (the
        # attention backends widen what they read to the queries' dtype).
        self.kv_dtype = dtype
        self.kernels = None
        if kernels is not False and self.device.type == "cpu" and dtype == torch.float32:
            self.kernels = _kernels.get()
        if kernels and self.kernels is None:
            raise RuntimeError("kernels=True, but the compiled kernels do not apply or load")
        self.torch_attention = _torch_attention(self.device)
        if self.kernels is not None:  # one K cache layout for both backends: the kernels'
            self.torch_attention.k_tile = self.kernels.vector_lanes()
        self.kernel_attention = KernelPagedAttention(self.kernels) if self.kernels else None
        # One step path for every step size and paged attention for fresh prompts, so that a
        # row's output does not depend on its batch (set_batch_invariant; docs/kernels.md).
        self.batch_invariant = True
        # Called between two decoder layers of every forward (not after the last): the engine's
        # cut-in point, where a step for a newly arrived P0 request may run while this one
        # waits (engine/async_engine.py). None: nothing is called.
        self.layer_hook: Callable[[], None] | None = None

    @abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        logits_rows: torch.Tensor,
        hidden_rows: torch.Tensor | None = None,
        blas: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...

    @abstractmethod
    def head(self, hidden: torch.Tensor, blas: bool = False) -> torch.Tensor: ...

    @abstractmethod
    def weight_bytes(self) -> int:
        """Bytes of every linear weight as stored (what a decode step reads)."""

    # -- step paths: what the model's layers allow (an architecture overrides the two hooks) --
    def attention_supported_by_kernel(self, block_size: int) -> bool:
        """Every layer's attention runs in the compiled kernel."""
        return False

    def has_fused_layer(self) -> bool:
        """Every decoder layer is exactly what the fused C++ layer computes."""
        return False

    def paths(self, block_size: int) -> tuple[str, ...]:
        """The step paths this model can run here (`model/plan.py`)."""
        if self.kernels is None:
            return ("torch",)
        if not self.attention_supported_by_kernel(block_size):
            return ("mixed", "torch")  # kernel GEMMs, PyTorch attention
        offer = self.bf16_gemms and self.device.type == "cpu" and amx_available()
        return tuple(
            p for p in PATHS if (p != "fused" or self.has_fused_layer()) and (p != "bf16" or offer)
        )

    def set_batch_invariant(self, on: bool) -> None:
        """Invariance on (the default) or off (the fastest path per step size, and fresh prompts
        through PyTorch's SDPA on the ``kernel`` path)."""
        self.batch_invariant = on
        if self.kernel_attention is not None:
            self.kernel_attention.invariant = on

    def use_plan(self, plan: StepPlan) -> None:  # noqa: B027 (a hook: most models need nothing)
        """The executor's plan, once known (measured, cached or the default)."""

    def default_plan(self, block_size: int) -> StepPlan:
        """The plan before (or without) measurement: the kernels wherever they apply."""
        paths = self.paths(block_size)
        if paths == ("torch",):
            return TORCH_ONLY
        if "fused" not in paths:
            return StepPlan(((NEVER, paths[0]),))
        return StepPlan()

    def backend(self, path: str) -> AttentionBackend:
        return self.kernel_attention if uses_kernel_attention(path) else self.torch_attention

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, ...]:
        c = self.config
        return (c.num_kv_heads, num_blocks, block_size, c.head_dim)


def _torch_attention(device: torch.device) -> TorchPagedAttention:
    """On CUDA, decodes read their blocks in place through the Triton kernel where Triton is
    (model/attention/triton_paged.py); elsewhere the PyTorch reference."""
    if device.type == "cuda":
        from tierserve.model.attention.triton_paged import TritonPagedAttention, triton_available

        if triton_available():
            return TritonPagedAttention()
    return TorchPagedAttention()
