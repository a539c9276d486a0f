"""The CPU's tensor-parallel all-reduce: gloo against the shared-memory collectives
(`executor/shm_comm.py`), two processes of one thread each, a decode step's sizes and larger.

    python benchmarks/kernels/tp_collectives.py
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import time

import torch
import torch.distributed as dist

from tierserve.executor import shm_comm

SIZES = (768, 768 * 8, 768 * 512)


def _rank(rank: int, port: int, path: str, out) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    comm = shm_comm.ShmComm(path, rank, 2, timeout_s=60)
    for name, reduce in (("gloo", dist.all_reduce), ("shared memory", comm.all_reduce)):
        for n in SIZES:
            x = torch.ones(n)
            for _ in range(50):
                reduce(x.fill_(1.0))
            t0 = time.perf_counter()
            for _ in range(500):
                reduce(x.fill_(1.0))
            if rank == 0:
                out.put((name, n, (time.perf_counter() - t0) / 500 * 1e6))
    dist.destroy_process_group()


def main() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    path = shm_comm.create(2)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, path, out)) for r in range(2)]
    for p in procs:
        p.start()
    rows = [out.get(timeout=300) for _ in range(2 * len(SIZES))]
    for p in procs:
        p.join()
    os.unlink(path)
    print("| all-reduce of | gloo us | shared memory us |")
    print("|---|---|---|")
    for n in SIZES:
        g, m = (
            next(us for name, k, us in rows if k == n and name == w)
            for w in ("gloo", "shared memory")
        )
        print(f"| {n} floats | {g:.0f} | {m:.1f} |")


if __name__ == "__main__":
    main()
