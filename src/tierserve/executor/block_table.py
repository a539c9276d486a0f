"""Persistent block tables: one int32 row per running request, updated in place as the KV manager
hands out blocks, so a step never rebuilds or pads its requests' tables. The paged-attention
kernel reads rows by index; the PyTorch path gathers the rows it needs."""

from __future__ import annotations

import numpy as np
import torch


class BlockTables:
    def __init__(self, rows: int = 64, width: int = 64) -> None:
        self.tensor = torch.zeros((rows, width), dtype=torch.int32)
        self._np = self.tensor.numpy()  # shares memory with the tensor
        self._free = list(range(rows - 1, -1, -1))
        self._len: dict[int, int] = {}

    @property
    def array(self) -> np.ndarray:
        return self._np

    def assign(self, block_ids: list[int]) -> int:
        """A row holding `block_ids`; returns its index."""
        if not self._free:
            self._resize(2 * self.tensor.shape[0], self.tensor.shape[1])
        row = self._free.pop()
        self._len[row] = 0
        self.extend(row, block_ids)
        return row

    def extend(self, row: int, block_ids: list[int]) -> None:
        n, k = self._len[row], len(block_ids)
        if n + k > self.tensor.shape[1]:
            self._resize(self.tensor.shape[0], max(2 * self.tensor.shape[1], n + k))
        self._np[row, n : n + k] = block_ids
        self._len[row] = n + k

    def release(self, row: int) -> None:
        del self._len[row]
        self._free.append(row)

    def _resize(self, rows: int, width: int) -> None:
        old = self.tensor
        self.tensor = torch.zeros((rows, width), dtype=torch.int32)
        self.tensor[: old.shape[0], : old.shape[1]] = old
        self._np = self.tensor.numpy()
        self._free.extend(range(rows - 1, old.shape[0] - 1, -1))
