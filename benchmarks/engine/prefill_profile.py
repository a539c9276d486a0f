"""Where one prompt's prefill goes (a P0's own express step): a prompt of N token ids through
`tierserve.LLM` at the defaults, best of three, then once under cProfile, printing the top
functions by their own time (the compiled GEMMs show as `tierserve_kernels.*`).

    .venv/bin/python benchmarks/engine/prefill_profile.py [--tokens 160] [--top 12]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from tierserve import LLM
from tierserve.sampling_params import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    llm = LLM(kv_cache_gib=0.2, enable_prefix_caching=False)
    sp = SamplingParams(temperature=0, max_tokens=1)

    def prompt(offset: int) -> list[int]:
        return [1000 + (i * 7 + offset) % 30000 for i in range(args.tokens)]

    llm.generate([prompt(0)], sp)  # warm-up
    best = float("inf")
    for offset in range(1, 4):
        t = time.perf_counter()
        llm.generate([prompt(offset)], sp)
        best = min(best, time.perf_counter() - t)
    print(f"prefill of {args.tokens} tokens: {best * 1e3:.1f} ms (best of 3)")
    prof = cProfile.Profile()
    prof.enable()
    llm.generate([prompt(9)], sp)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
