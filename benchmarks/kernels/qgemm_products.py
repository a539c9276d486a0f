"""The quantized GEMM at each product mode (float32, bf16, int8) on the embedded model's
shapes, median ms per call with the weights warm in cache (issue 20's int8 products):

    # the machine's threads; one thread; CPU time on one thread; beside a busy process on one
    # core (what a co-tenant does to the threads):
    .venv/bin/python benchmarks/kernels/qgemm_products.py
    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python benchmarks/kernels/qgemm_products.py
    .venv/bin/python benchmarks/kernels/qgemm_products.py --modes int8 --cpu-time
    .venv/bin/python benchmarks/kernels/qgemm_products.py --modes int8 --rows 1 16 160 \
        --busy-core

A mode the CPU lacks (bf16 without AVX512_BF16, int8 without AVX512_VNNI or AVX2) runs as float32.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch

from tierserve import kernels
from tierserve.model import quant

SHAPES = [("qkv q4_1", "q4_1", 960, 576), ("gate_up q4_1", "q4_1", 3072, 576),
          ("down q4_1", "q4_1", 576, 1536), ("head q8_0", "q8_0", 49152, 576)]  # fmt: skip


def median_ms(fn, reps: int, clock=time.perf_counter) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = clock()
        fn()
        ts.append(clock() - t)
    return sorted(ts)[len(ts) // 2] * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", nargs="+", default=["f32", "bf16", "int8"])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--busy-core", action="store_true", help="a CPU burner runs meanwhile")
    ap.add_argument(
        "--cpu-time", action="store_true",
        help="one kernel thread, timed by its own CPU time (time.thread_time): on a shared VM "
        "whose wall time moves 1.5x between runs, this moved ±3%%"
    )  # fmt: skip
    a = ap.parse_args()
    burner = None
    if a.busy_core:  # one busy core at normal priority, like a compile beside the server
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        run(a)
    finally:
        if burner is not None:
            burner.kill()


def run(a: argparse.Namespace) -> None:
    ext = kernels.get()
    if ext is None:
        raise SystemExit("the compiled kernels are unavailable")
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    print(next((ln for ln in cpu.splitlines() if "Model name" in ln), "?"))
    if a.cpu_time:
        ext.set_kernel_threads(1)
        torch.set_num_threads(1)
    clock = time.thread_time if a.cpu_time else time.perf_counter
    threads = ext.kernel_threads() if hasattr(ext, "kernel_threads") else torch.get_num_threads()
    print("threads", threads, " bf16", ext.QWeight.bf16_available(),
          " int8", ext.QWeight.int8_available(), " busy core", a.busy_core)  # fmt: skip
    torch.manual_seed(1)
    for name, fmt, n, k in SHAPES:
        p = quant.pack(quant.quantize(torch.randn(n, k) * 0.1, fmt))
        f = quant.KERNEL_FORMAT[fmt]
        modes = {m: ext.QWeight(f, p.q, p.d, p.m, m == "bf16", m == "int8")
                 for m in a.modes}  # fmt: skip
        for rows in a.rows:
            x, out = torch.randn(rows, k), torch.empty(rows, n)
            reps = max(3, a.reps // 7) if n > 10000 else a.reps
            ms = {}
            for m, w in modes.items():

                def call(w=w, x=x, o=out):
                    ext.weight_linear_into(x, w, None, o, False)

                ms[m] = median_ms(call, reps, clock)
            print(f"{name:14s} rows {rows:3d}  " + "  ".join(f"{m} {v:.3f}" for m, v in ms.items()))


if __name__ == "__main__":
    main()
