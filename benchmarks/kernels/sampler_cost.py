"""What one request with a grammar, penalties or top logprobs costs the others in its batch.

`tierserve bench-engine`'s workload (N closed-loop clients, 128-token random prompts, 64 greedy
output tokens, ignore_eos) on one engine, in variants that differ only in client 0's requests:

- plain: like everyone else's;
- grammar: a JSON schema (an array of at least 64 strings, so the grammar never ends the
  request before its 64 tokens), i.e. a token mask computed and applied every step;
- penalties: presence 0.5, frequency 0.5, repetition 1.2 (token counts kept and applied);
- logprobs: top 5 logprobs per token.

Variants are interleaved `--repeats` times in one process (the only fair A/B on a shared
machine); the report gives each variant's median step time (all steps, median over repeats) and
its difference to plain. Run:

    .venv/bin/python benchmarks/kernels/sampler_cost.py --concurrency 8 32 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time

from tierserve.bench.engine_bench import _prompts
from tierserve.engine.args import EngineArgs
from tierserve.engine.builder import build_engine
from tierserve.grammar import GrammarSpec
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams

PLAIN = SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True)
LONG_ARRAY = {"type": "array", "items": {"type": "string"}, "minItems": 64}
SPECIAL = {
    "plain": PLAIN,
    "grammar": SamplingParams(
        temperature=0.0, max_tokens=64, grammar=GrammarSpec.json_schema(LONG_ARRAY)
    ),
    "penalties": SamplingParams(
        temperature=0.0,
        max_tokens=64,
        ignore_eos=True,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        repetition_penalty=1.2,
    ),
    "logprobs": SamplingParams(temperature=0.0, max_tokens=64, ignore_eos=True, top_logprobs=5),
}


def run(built, n: int, rounds: int, special: SamplingParams, tag: str) -> float:
    """Median step time (ms) of n closed-loop clients; client 0 sends `special` requests."""
    eng = built.engine
    prompts = _prompts(n * rounds, 128, built.model_config.vocab_size, seed=7)
    sent = 0

    def submit(client: int) -> None:
        nonlocal sent
        sp = special if client == 0 else PLAIN
        rid = f"{tag}-{client}-{sent}"
        eng.add_request(Request(rid, prompts[sent], sp, arrival_time=eng.clock.now()))
        owner[rid] = client
        sent += 1

    owner: dict[str, int] = {}
    for c in range(n):
        submit(c)
    steps = []
    while eng.has_unfinished():
        t0 = time.perf_counter()
        changed = eng.step()
        steps.append(time.perf_counter() - t0)
        for r in changed:
            if r.is_finished:
                if r.error:
                    raise RuntimeError(f"{r.request_id}: {r.error}")
                if sent < len(prompts):
                    submit(owner[r.request_id])
    return 1e3 * statistics.median(steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    ap.add_argument("--rounds", type=int, default=2, help="requests per client")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    built = build_engine(
        EngineArgs(kv_cache_gib=1.0, max_num_seqs=max(args.concurrency),
                   max_num_batched_tokens=2048, enable_prefix_caching=False)
    )  # fmt: skip
    run(built, 2, 1, SPECIAL["grammar"], "warm")  # builds the grammar engine's tokenizer once
    print(f"{'conc':>5} {'variant':<10} {'step ms (median of repeats)':>28} {'vs plain':>9}")
    for n in args.concurrency:
        got: dict[str, list[float]] = {k: [] for k in SPECIAL}
        for rep in range(args.repeats):
            for name, sp in SPECIAL.items():
                got[name].append(run(built, n, args.rounds, sp, f"{name}{n}.{rep}"))
        base = statistics.median(got["plain"])
        for name, ms in got.items():
            med = statistics.median(ms)
            each = " ".join(f"{x:.1f}" for x in ms)
            print(f"{n:>5} {name:<10} {med:>8.2f} ({each}) {100 * (med / base - 1):>+8.1f}%")


if __name__ == "__main__":
    main()
