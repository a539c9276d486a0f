"""The float32 GEMM cost of the embedded model's layers on this machine, by rows per step (M).

A decode step multiplies M = batch rows by every weight matrix; a prefill step by M = prompt
tokens. This times the 30 layers' four projections (fused q/k/v, o, fused gate/up, down; distinct
weights per layer, so they stream from memory as in the engine) and the tied vocabulary head,
with the engine's own ``x @ W_t`` layout, and prints ms per pass, ms per row and GFLOP/s. It is
the floor under the engine's step time (docs/performance.md). Where the compiled kernels are
built (`tierserve.kernels`), their GEMM is timed on the same weights, alternating with BLAS,
in the last columns, the head included (the engine's choice between the two: model/llama.py).
Run:

    .venv/bin/python benchmarks/kernels/gemm_curve.py
"""

from __future__ import annotations

import argparse
import time

import torch

HIDDEN, QKV, INTER, VOCAB = 576, 960, 1536, 49152
SHAPES = [(HIDDEN, QKV), (HIDDEN, HIDDEN), (HIDDEN, 2 * INTER), (INTER, HIDDEN)]


def blas(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.mm(x, w)


def kernel_mm(ext):
    def mm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        out = x.new_empty((x.shape[0], w.shape[1]))
        ext.linear_into(x, w, None, out, False)
        return out

    return mm


def time_pass(weights, m: int, reps: int, mm=blas) -> float:
    xs = {k: torch.randn(m, k) for k in {s[0] for s in SHAPES}}
    for layer in weights:  # warm
        for w in layer:
            mm(xs[w.shape[0]], w)
    t0 = time.perf_counter()
    for _ in range(reps):
        for layer in weights:
            for w in layer:
                mm(xs[w.shape[0]], w)
    return (time.perf_counter() - t0) / reps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--m", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256, 512, 2048])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    weights = [[torch.randn(i, o) * 0.02 for i, o in SHAPES] for _ in range(args.layers)]
    head = torch.randn(HIDDEN, VOCAB) * 0.02
    flops_per_row = 2 * args.layers * sum(i * o for i, o in SHAPES)
    from tierserve import kernels

    ext = kernels.get()
    print(f"{args.layers} layers, float32, {torch.get_num_threads()} threads")
    print(
        f"{'M':>6}{'layers ms':>11}{'ms/row':>9}{'GFLOP/s':>9}{'head ms':>9}"
        + (f"{'kernel ms':>11}{'GFLOP/s':>9}{'speed-up':>10}{'k head ms':>11}" if ext else "")
    )
    for m in args.m:
        t = time_pass(weights, m, args.reps)
        th = time_pass([[head]], m, args.reps)
        line = (
            f"{m:>6}{1e3 * t:>11.1f}{1e3 * t / m:>9.3f}{m * flops_per_row / t / 1e9:>9.0f}"
            f"{1e3 * th:>9.1f}"
        )
        if ext:
            tk = time_pass(weights, m, args.reps, kernel_mm(ext))
            t = min(t, time_pass(weights, m, args.reps))  # BLAS again, after the kernel
            tkh = time_pass([[head]], m, args.reps, kernel_mm(ext))
            line += f"{1e3 * tk:>11.1f}{m * flops_per_row / tk / 1e9:>9.0f}{t / tk:>9.2f}x"
            line += f"{1e3 * tkh:>11.2f}"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
