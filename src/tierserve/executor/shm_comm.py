"""Collectives for ranks on one host, through shared memory: what tensor parallelism on the CPU
uses instead of gloo (as vLLM's and SGLang's CPU backends do).

Gloo's all-reduce of a decode step's few kilobytes takes 1.1-1.5 ms on a 2-vCPU VM (its TCP pair
and worker threads wake each other); a decode step makes two a layer. Here a rank copies its
part into its slot of a shared file, publishes a sequence number, and waits (spinning, then
yielding) until every rank has published it; then each rank reads the slots itself, summing them
in rank order, so every rank gets the same bits. Two sets of slots alternate: a rank writes a set
again only after every rank has published the call after the one that last used it, which each
rank does only once it has finished reading. Messages larger than a slot go in pieces.

The ordering this relies on (the data stores before the flag's, the flag's load before the data's)
is x86's: `available()` is False elsewhere, and the ranks use gloo.

A rank that does not publish within the timeout, or whose peer is gone (`abort()` says so), fails
the collective with RuntimeError, as a gloo timeout would.
"""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
import tempfile
import time
from collections.abc import Callable

import torch

FLAG_STRIDE = 64  # bytes: one cache line per rank's flag
HEADER = 4096
SLOT_BYTES = 8 << 20
SPINS = 300  # busy polls (a few hundred microseconds) before yielding the CPU and the GIL


def available() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64") and os.environ.get(
        "TIERSERVE_TP_SHM", "on"
    ).strip().lower() not in ("off", "0", "false")


def create(size: int, slot_bytes: int = SLOT_BYTES) -> str:
    """Rank 0: a new zeroed file for `size` ranks (in /dev/shm where there is one); its path."""
    where = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    path = os.path.join(where, f"tierserve-tp-{os.getpid()}-{secrets.token_hex(4)}")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, HEADER + 2 * size * slot_bytes)
    finally:
        os.close(fd)
    return path


class ShmComm:
    def __init__(
        self,
        path: str,
        rank: int,
        size: int,
        timeout_s: float,
        abort: Callable[[], str | None] | None = None,
        slot_bytes: int = SLOT_BYTES,
    ) -> None:
        self.path, self.rank, self.size = path, rank, size
        self.timeout_s, self.abort, self.slot_bytes = timeout_s, abort, slot_bytes
        total = HEADER + 2 * size * slot_bytes
        self.buf = torch.from_file(path, shared=True, size=total, dtype=torch.uint8)
        step = FLAG_STRIDE // 8
        self.flags = self.buf[: size * FLAG_STRIDE].view(torch.int64).numpy()[::step]
        self.seq = 0

    # -- the protocol ----------------------------------------------------------------------
    def _slot(self, seq: int, rank: int, dtype: torch.dtype, n: int) -> torch.Tensor:
        off = HEADER + ((seq % 2) * self.size + rank) * self.slot_bytes
        return self.buf[off : off + n * dtype.itemsize].view(dtype)

    def _wait(self, seq: int, ranks=None) -> None:
        flags = self.flags if ranks is None else self.flags[ranks]
        if flags.min() >= seq:
            return
        t0 = time.monotonic()
        spins = 0
        while True:
            flags = self.flags if ranks is None else self.flags[ranks]
            if flags.min() >= seq:
                return
            spins += 1
            if spins < SPINS:
                continue
            time.sleep(0)  # let the other threads of this process (and host) run
            if spins % 256 == 0:
                why = self.abort() if self.abort is not None else None
                late = [r for r in range(self.size) if self.flags[r] < seq]
                if why:
                    raise RuntimeError(f"shared-memory collective abandoned: {why}")
                if time.monotonic() - t0 > self.timeout_s:
                    raise RuntimeError(
                        f"shared-memory collective timed out after {self.timeout_s:g} s "
                        f"waiting for rank(s) {late}"
                    )

    def _publish(self, seq: int) -> None:
        self.flags[self.rank] = seq

    def _begin(self) -> int:
        """The next call's number, once its slots are free (every rank finished the call two
        before, which used them)."""
        self.seq += 1
        self._wait(self.seq - 1)
        return self.seq

    # -- collectives -----------------------------------------------------------------------
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks, in place (a contiguous CPU tensor)."""
        flat = x.view(-1)
        per = self.slot_bytes // x.element_size()
        for start in range(0, flat.numel(), per):
            part = flat[start : start + per]
            n = part.numel()
            seq = self._begin()
            self._slot(seq, self.rank, x.dtype, n).copy_(part)
            self._publish(seq)
            self._wait(seq)
            part.copy_(self._slot(seq, 0, x.dtype, n))
            for r in range(1, self.size):
                part.add_(self._slot(seq, r, x.dtype, n))
        return x

    def all_gather_rows(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Each rank's [R, C] (same shape everywhere), on every rank, in rank order."""
        rows, cols = x.shape
        per = max(1, self.slot_bytes // max(1, cols * x.element_size()))
        outs = [x.new_empty((rows, cols)) for _ in range(self.size)]
        for start in range(0, rows, per):
            part = x[start : start + per]
            n = part.numel()
            seq = self._begin()
            self._slot(seq, self.rank, x.dtype, n).copy_(part.reshape(-1))
            self._publish(seq)
            self._wait(seq)
            for r in range(self.size):
                outs[r][start : start + per].copy_(self._slot(seq, r, x.dtype, n).view(part.shape))
        return outs

    def broadcast(self, x: torch.Tensor, src: int = 0) -> torch.Tensor:
        """`src`'s x on every rank, in place (fits one slot)."""
        n = x.numel()
        if n * x.element_size() > self.slot_bytes:
            raise ValueError("broadcast: larger than a slot")
        seq = self._begin()
        if self.rank == src:
            self._slot(seq, src, x.dtype, n).copy_(x.view(-1))
        else:
            self._wait(seq, [src])
            x.view(-1).copy_(self._slot(seq, src, x.dtype, n))
        self._publish(seq)
        return x

    def close(self, remove: bool = False) -> None:
        self.buf = None
        self.flags = None
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
