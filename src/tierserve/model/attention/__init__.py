"""Attention backends: one interface, each backend with its own metadata.

A step's batch (`executor/batch.py`) is described once, backend-neutrally, as a `BatchLayout`
(numpy arrays of each request's first row, row count, context start and block-table row). The
backend chosen for the step builds its own metadata from it and runs attention with it:

* ``torch`` (`torch_paged.py`): the pure-PyTorch reference, on any device: decodes gather
  their blocks into a padded batch, prefill chunks run SDPA;
* ``kernel`` (`kernel_paged.py`): the compiled CPU kernel reads K/V straight from the paged
  cache through persistent block tables, in segments; in a fused step every request is a
  segment and the model runs whole decoder layers in C++ (`kernels/csrc/layer.cpp`).

`AttentionMetadata` objects carry their backend, so the model calls
``meta.backend.forward(..., spec)`` without knowing which one the step uses. `spec`
(`AttentionSpec`) is what the layer asks of attention beyond plain causal GQA: a score scale,
a sliding window, soft-capped scores. The PyTorch backend runs every spec; the kernel backend
says which it runs (``supports``), and a model with layers it does not cover runs its steps
with PyTorch attention (the ``mixed`` path).
"""

from __future__ import annotations

from tierserve.model.attention.base import (
    PLAIN,
    AttentionBackend,
    AttentionMetadata,
    AttentionSpec,
    BatchLayout,
)
from tierserve.model.attention.kernel_paged import KernelPagedAttention
from tierserve.model.attention.torch_paged import TorchPagedAttention, write_kv

__all__ = [
    "PLAIN",
    "AttentionBackend",
    "AttentionMetadata",
    "AttentionSpec",
    "BatchLayout",
    "KernelPagedAttention",
    "TorchPagedAttention",
    "write_kv",
]
