"""Decode speed by where the model was loaded and where it runs (OpenMP teams, issue 13).

Each variant runs in a fresh process, because an OpenMP team lives as long as its thread:
  main    load and generate on the main thread (what `bench-engine` and `LLM` do);
  thread  load on the main thread, generate on a second thread (the server before the fix);
  off     load on a short-lived thread, generate on another (`build_engine_off_main`).
Prints ms per generated token (64 tokens, greedy, one 150-word prompt), per repeat. Run:

    .venv/bin/python benchmarks/engine/engine_thread_ab.py [--repeats 6]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time


def child(variant: str, repeats: int) -> None:
    from tierserve.llm import LLM
    from tierserve.sampling_params import SamplingParams

    box: dict = {}

    def build() -> None:
        box["llm"] = LLM()

    def run() -> None:
        llm = box["llm"]
        sp = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
        llm.generate(["word " * 150], sp)  # warm-up
        res = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            llm.generate(["word " * 150], sp)
            res.append(round((time.perf_counter() - t0) / 64 * 1e3, 1))
        print(f"{variant:7s} ms/token {res}", flush=True)

    def on_thread(fn) -> None:
        t = threading.Thread(target=fn)
        t.start()
        t.join()

    (on_thread if variant == "off" else lambda f: f())(build)
    (run if variant == "main" else lambda: on_thread(run))()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--child", choices=("main", "thread", "off"))
    args = ap.parse_args()
    if args.child:
        child(args.child, args.repeats)
        return
    for variant in ("main", "thread", "off"):
        cmd = [sys.executable, __file__, "--child", variant, "--repeats", str(args.repeats)]
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
