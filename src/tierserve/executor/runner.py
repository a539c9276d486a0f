"""The model runner: one forward pass of the model over a step's batch, reading and writing the
executor's paged KV cache through its block tables. The executor (torch_executor.py) owns the
requests' state and the sampling; the runner owns how the model is run (the step path's
threads; decode-only steps replayed from CUDA graphs, graphs.py)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from tierserve.executor.batch import Batch, forward_step
from tierserve.executor.graphs import DecodeGraphs
from tierserve.model.base import CausalLM

if TYPE_CHECKING:
    from tierserve.executor.block_table import BlockTables
    from tierserve.executor.state import RequestState


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        tables: BlockTables,
        block_size: int,
    ) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.tables = tables
        self.block_size = block_size
        self.graphs: DecodeGraphs | None = None  # decode-only steps replayed (graphs.py)

    def run(
        self,
        states: dict[str, RequestState],
        scheduled: dict[str, int],
        path: str,
        drafts: dict[str, int] | None = None,
    ) -> tuple[Batch, Any]:
        """The model over one step's batch on step path `path`: its KV written into the
        cache, the batch it was built from and the logits of its sampled rows (with the
        scored rows' hidden states where prompt logprobs are asked for)."""
        if self.graphs is not None and path == "torch":
            key = self.graphs.key(states, scheduled, drafts)
            if key is not None:
                return self.graphs.run(states, scheduled, self.tables, key)
        with self._torch_team(path):
            return forward_step(
                self.model, self.kv_caches, self.tables, self.block_size, states, scheduled,
                path, drafts=drafts,
            )  # fmt: skip

    @contextlib.contextmanager
    def _torch_team(self, path: str):
        """The ``bf16`` path's GEMMs and attention are PyTorch ops (oneDNN): where the compiled
        kernels own the CPU threads and PyTorch's ops run on one (`engine.builder.split_threads`),
        its steps borrow the kernels' thread count for PyTorch (0.2 us to switch; one thread
        left a 512-row prefill on this path no faster than the fused layer's on two)."""
        k = self.model.kernels
        want = k.kernel_threads() if path == "bf16" and k is not None else 0
        before = torch.get_num_threads()
        if want <= before:
            yield
            return
        torch.set_num_threads(want)
        try:
            yield
        finally:
            torch.set_num_threads(before)
