"""The collectives of a tensor-parallel model: NCCL on CUDA (one device per rank, ``cuda:<rank>``),
shared memory on the CPU (`executor/shm_comm.py`: the ranks share a host; gloo where the CPU's
memory ordering is not x86's, or with ``TIERSERVE_TP_SHM=off``). torch.distributed's group is
joined either way (gloo on the CPU).

The model calls three of them (`model/decoder.py`): `all_reduce` after each row-parallel
projection (o, down) and after the vocabulary-parallel embedding lookup, and `gather_logits`
for the vocabulary-parallel head. The executor calls `share_tokens`: rank 0 samples, every rank
appends the tokens rank 0 drew (so the ranks' request states never drift apart).

A rank that stops answering fails the others' next collective: at once when its process is
gone (the connection closes), after `timeout_s` when it hangs.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Callable

import torch
import torch.distributed as dist

from tierserve.executor import shm_comm
from tierserve.executor.shm_comm import ShmComm

DEFAULT_TIMEOUT_S = 60.0


def timeout_s() -> float:
    """$TIERSERVE_TP_TIMEOUT_S: how long a collective waits for a silent rank (default 60)."""
    raw = os.environ.get("TIERSERVE_TP_TIMEOUT_S", "").strip()
    return float(raw) if raw else DEFAULT_TIMEOUT_S


def backend_for(device: str) -> str:
    return "nccl" if str(device).startswith("cuda") else "gloo"


class TPGroup:
    """Rank `rank` of `size` in the default process group."""

    def __init__(
        self, rank: int, size: int, device: torch.device | str, shm_path: str | None = None
    ) -> None:
        self.rank = rank
        self.size = size
        self.device = torch.device(device)
        self.shm_path = shm_path  # the CPU's shared-memory file (rank 0 made it)
        self.shm: ShmComm | None = None
        # Why to give up waiting for the others (a worker gone): the owner sets it.
        self.abort: Callable[[], str | None] | None = None

    @classmethod
    def for_rank0(cls, size: int, device: str) -> TPGroup:
        """Rank 0's group; on the CPU with its shared-memory file made (when it applies)."""
        cpu = torch.device(device).type == "cpu"
        path = shm_comm.create(size) if cpu and shm_comm.available() else None
        return cls(0, size, device, path)

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
        if self.shm_path is not None:
            self.shm = ShmComm(
                self.shm_path, self.rank, self.size, timeout_s(), abort=lambda: self._why()
            )
        return self

    def _why(self) -> str | None:
        return self.abort() if self.abort is not None else None

    @property
    def driver(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum `x` over the ranks, in place."""
        if self.shm is not None and x.is_contiguous():
            return self.shm.all_reduce(x)
        dist.all_reduce(x)
        return x

    def gather_logits(self, part: torch.Tensor, vocab: int) -> torch.Tensor:
        """[S, V/size] on each rank -> [S, V] (the padding columns dropped), on every rank."""
        if self.shm is not None:
            parts = self.shm.all_gather_rows(part.contiguous())
            return torch.cat(parts, dim=1)[:, :vocab]
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
        if self.shm is not None and n * 8 <= self.shm.slot_bytes:
            return self.shm.broadcast(buf, src=0).tolist()
        buf = buf.to(self.device)
        dist.broadcast(buf, src=0)
        return buf.tolist()

    def unlink_shm(self) -> None:
        """Rank 0, once every rank has mapped the shared-memory file: remove its name (the
        mappings stay), so that nothing is left behind however the processes end."""
        if self.rank == 0 and self.shm_path is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.shm_path)

    def close(self) -> None:
        if self.shm is not None:
            self.shm.close()
            self.shm = None
        self.unlink_shm()
        if dist.is_initialized():
            dist.destroy_process_group()
