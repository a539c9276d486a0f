"""One row through the model's weight shapes with the GEMM kernel (`linear_into`), caches cold.

Each shape cycles through enough distinct weights (~300 MB) that none stays in cache, as in a
real decode step; prints ms and GB/s of weights streamed per shape, and the total for 30
layers plus the vocabulary head. Run:

    .venv/bin/python benchmarks/gemm_one_row.py [--rows 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tierserve import kernels

# SmolLM2-135M: hidden 576, 9 query + 2 x 3 kv heads of 64, MLP 1536, vocabulary 49,152.
SHAPES = {
    "qkv": (576, 960),
    "o": (576, 576),
    "gate_up": (576, 3072),
    "down": (1536, 576),
    "head": (576, 49152),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    k = kernels.get()
    if k is None:
        raise SystemExit("the kernels are not built (make setup) or TIERSERVE_KERNELS=off")
    total = 0.0
    for name, (K, N) in SHAPES.items():
        ws = [torch.randn(K, N) for _ in range(max(1, 300_000_000 // (K * N * 4)))]
        a = torch.randn(args.rows, K)
        out = torch.empty(args.rows, N)
        for w in ws:
            k.linear_into(a, w, None, out, False)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for w in ws:
                k.linear_into(a, w, None, out, False)
            times.append((time.perf_counter() - t0) / len(ws))
        t = statistics.median(times)
        total += t * (1 if name == "head" else 30)
        err = (out - a @ ws[-1]).abs().max().item()
        print(f"{name:8s} {t * 1e3:7.3f} ms  {K * N * 4 / t / 1e9:6.1f} GB/s  max err {err:.1e}")
    print(f"30 layers + head, {args.rows} row(s): {total * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
