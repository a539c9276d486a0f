"""Time pure decode steps of the real engine at given batch sizes, and break one batch size's
step down by operator with the torch profiler. Run:

    .venv/bin/python benchmarks/engine/decode_step_profile.py --batch 1 8 32 64 --profile 32
    .venv/bin/python benchmarks/engine/decode_step_profile.py --batch 4 16 --prompt 1024 \
        --kv-cache-dtype auto float16 --rounds 3

With several `--kv-cache-dtype` values, each batch size runs them in turn, `--rounds` times,
and reports each one's median step.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from torch.profiler import ProfilerActivity, profile

from tierserve.engine.args import EngineArgs
from tierserve.engine.builder import build_engine
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams


def decode_steps(
    batch: int, dtype: str | None, steps: int = 20, prompt: int = 128, kv: str = "auto"
):
    built = build_engine(EngineArgs(kv_cache_gib=1.0, max_num_seqs=max(batch, 1),
                                    max_num_batched_tokens=8192, measure_costs=False,
                                    dtype=dtype, kv_cache_dtype=kv))  # fmt: skip
    eng = built.engine
    rng = random.Random(0)
    # room to decode while the other prompts are still being prefilled
    sp = SamplingParams(temperature=0, max_tokens=steps + 60 + 1024, ignore_eos=True)
    reqs = [
        Request(f"r{i}", [rng.randrange(100, 40000) for _ in range(prompt)], sp)
        for i in range(batch)
    ]
    for r in reqs:
        eng.add_request(r)
    # Every prompt prefilled first: batch x prompt beyond the step's token budget (or its time
    # bound) takes several steps, and a step that still carries a prompt chunk is no decode.
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in reqs):
        eng.step()
    for _ in range(30):  # context grows to ~prompt + 30, warm
        eng.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        eng.step()
        times.append(time.perf_counter() - t0)
    return eng, statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--profile", type=int, default=None, help="break this batch size down")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens of each request")
    ap.add_argument("--kv-cache-dtype", nargs="+", default=["auto"])
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    for b in args.batch:
        meds: dict[str, list[float]] = {kv: [] for kv in args.kv_cache_dtype}
        for _ in range(args.rounds):
            for kv in args.kv_cache_dtype:
                meds[kv].append(decode_steps(b, args.dtype, prompt=args.prompt, kv=kv)[1])
        for kv, m in meds.items():
            runs = " / ".join(f"{1e3 * x:.1f}" for x in m)
            print(
                f"decode step, batch {b:>3}, prompt {args.prompt}, kv {kv}: "
                f"median {1e3 * statistics.median(m):.1f} ms ({runs})",
                flush=True,
            )
    if args.profile:
        eng, _ = decode_steps(args.profile, args.dtype, prompt=args.prompt)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                eng.step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
