"""A/B of the compiled CPU kernels against the pure-PyTorch path, interleaved in one process.

One engine, `batch` requests decoding; the executor switches between its step plan (the kernel
paths) and the pure-PyTorch plan every step, so both see the same contexts, the same machine
load and the same memory state. Prints the median decode step of each path (wall time, and CPU
time of the process, which a loaded machine distorts less with --threads 1) and their ratios.
Run:

    .venv/bin/python benchmarks/kernels/kernel_ab.py --batch 1 8 32 --steps 20 [--quantization none]

(`--quantization auto` pits the quantized kernels against BLAS on weights dequantized per call.)
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from tierserve.engine.args import EngineArgs
from tierserve.engine.builder import build_engine
from tierserve.model.plan import TORCH_ONLY
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams


def ab(batch: int, steps: int, prompt: int, temperature: float, quantization: str):
    built = build_engine(EngineArgs(kv_cache_gib=0.5, max_num_seqs=batch,
                                    max_num_batched_tokens=8192, measure_costs=False,
                                    quantization=quantization))  # fmt: skip
    eng, ex = built.engine, built.executor
    ext = ex.model.kernels
    plan_on = ex.plan
    if ext is None:
        raise SystemExit("the kernels are not available (TIERSERVE_KERNELS=off or no build)")
    rng = random.Random(0)
    sp = SamplingParams(temperature=temperature, max_tokens=2 * steps + 40, ignore_eos=True)
    for i in range(batch):
        eng.add_request(Request(f"r{i}", [rng.randrange(100, 40000) for _ in range(prompt)], sp))
    eng.step()
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(2 * steps + 8):
        on = i % 2 == 0
        ex.plan = plan_on if on else TORCH_ONLY
        t0, c0 = time.perf_counter(), time.process_time()
        eng.step()
        if i >= 8:  # warm-up steps of each path are not counted
            times[on].append((time.perf_counter() - t0, time.process_time() - c0))
    return {on: tuple(statistics.median(x[j] for x in times[on]) for j in (0, 1)) for on in times}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--steps", type=int, default=20, help="timed steps per path")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--quantization", default="none", help="none (float32 on both sides), auto")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for b in args.batch:
        r = ab(b, args.steps, args.prompt, args.temperature, args.quantization)
        (kw, kc), (tw, tc) = r[True], r[False]
        print(f"batch {b:>3}: wall ms kernels {1e3 * kw:6.1f} pytorch {1e3 * tw:6.1f} "
              f"({tw / kw:.2f}x); CPU ms kernels {1e3 * kc:6.1f} pytorch {1e3 * tc:6.1f} "
              f"({tc / kc:.2f}x)")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
