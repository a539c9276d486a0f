"""The collectives of a tensor-parallel model, over torch.distributed: gloo on the CPU, NCCL on
CUDA (one device per rank, ``cuda:<rank>``).

The model calls three of them (`model/decoder.py`): `all_reduce` after each row-parallel
projection (o, down) and after the vocabulary-parallel embedding lookup, and `gather_logits`
for the vocabulary-parallel head. The executor calls `share_tokens`: rank 0 samples, every rank
appends the tokens rank 0 drew (so the ranks' request states never drift apart).

A rank that stops answering fails the others' next collective: at once when its process is
gone (the connection closes), after `timeout_s` when it hangs.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 60.0


def timeout_s() -> float:
    """$TIERSERVE_TP_TIMEOUT_S: how long a collective waits for a silent rank (default 60)."""
    raw = os.environ.get("TIERSERVE_TP_TIMEOUT_S", "").strip()
    return float(raw) if raw else DEFAULT_TIMEOUT_S


def backend_for(device: str) -> str:
    return "nccl" if str(device).startswith("cuda") else "gloo"


class TPGroup:
    """Rank `rank` of `size` in the default process group."""

    def __init__(self, rank: int, size: int, device: torch.device | str) -> None:
        self.rank = rank
        self.size = size
        self.device = torch.device(device)

    def connect(self, port: int) -> TPGroup:
        """Join the group at 127.0.0.1:`port` (rank 0 listens there); returns when every rank
        has joined (or raises after the timeout)."""
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            backend_for(str(self.device)),
            init_method=f"tcp://127.0.0.1:{port}",
            rank=self.rank,
            world_size=self.size,
            timeout=datetime.timedelta(seconds=timeout_s()),
        )
        return self

    @property
    def driver(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place."""
        dist.all_reduce(x)
        return x

    def gather_logits(self, part: torch.Tensor, vocab: int) -> torch.Tensor:
        """[S, V/size] on each rank -> [S, V] (the padding columns dropped), on every rank."""
        parts = [torch.empty_like(part) for _ in range(self.size)]
        dist.all_gather(parts, part.contiguous())
        return torch.cat(parts, dim=1)[:, :vocab]

    def share_tokens(self, tokens: list[int] | None, n: int) -> list[int]:
        """Rank 0's `n` sampled tokens, on every rank (rank 0 passes them, the others None)."""
        buf = (
            torch.tensor(tokens, dtype=torch.int64)
            if self.driver
            else torch.empty(n, dtype=torch.int64)
        )
        buf = buf.to(self.device)
        dist.broadcast(buf, src=0)
        return buf.tolist()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
