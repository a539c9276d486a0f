"""Where a lone request's decode step goes (issue 20's 1-client gap): one greedy request of 128
tokens through `tierserve.LLM` at the defaults, timed, then the same under cProfile, printing
the top functions by their own time. The compiled calls show as `tierserve_kernels.*`.

    .venv/bin/python benchmarks/engine/lone_decode_profile.py [--tokens 128] [--top 18]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import subprocess
import time

from tierserve import LLM
from tierserve.sampling_params import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--top", type=int, default=18)
    args = ap.parse_args()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    print(next((ln for ln in cpu.splitlines() if "Model name" in ln), "?"))
    llm = LLM(kv_cache_gib=0.1)
    print("weights:", llm.executor.model.weights_summary)
    sp = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    llm.generate("Write a story about a cat.", sp)  # warm-up
    t = time.perf_counter()
    llm.generate("Write a story about a dog.", sp)
    dt = time.perf_counter() - t
    print(f"{args.tokens} tokens in {dt:.3f} s: {1e3 * dt / args.tokens:.2f} ms a token")
    prof = cProfile.Profile()
    prof.enable()
    llm.generate("Write a story about a bird.", sp)
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
