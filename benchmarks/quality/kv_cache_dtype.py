"""What a 16-bit KV cache (`--kv-cache-dtype`) does to the model's numbers, against a float32
cache on the same engine settings: prompt log-probabilities of the prompt sets (every
prompt token scored, so every position attends through the cache), and greedy outputs.

    .venv/bin/python benchmarks/quality/kv_cache_dtype.py [--activations float32 auto]
    [--max-tokens 64]

For each activation mode, reports per cache dtype the mean prompt log-probability (minus the
mean negative log-likelihood: quality), the mean and largest |delta logprob| against float32,
and how many greedy outputs are token-identical (and where the others first differ).
With float32 activations the figures are the cache's own rounding; with the default int8
activations (where the CPU has them) a small change upstream can move an activation across an
int8 rounding edge, so any perturbation shows at that quantization's scale. One process, one
engine at a time; name the CPU (`lscpu`) beside the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from tierserve.llm import LLM
from tierserve.sampling_params import SamplingParams

DATA = Path(__file__).resolve().parents[1] / "data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--activations", nargs="+", default=["float32", "auto"])
    ap.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=20, help="from each set")
    ap.add_argument("--sets", nargs="+", default=["grounded_prompts", "open_chat_prompts"])
    a = ap.parse_args()
    texts = []
    for name in a.sets:
        lines = (DATA / f"{name}.jsonl").read_text().splitlines()[: a.prompts]
        texts += [json.loads(line)["prompt"] for line in lines]
    score = SamplingParams(max_tokens=0, prompt_logprobs=0)
    greedy = SamplingParams(temperature=0, max_tokens=a.max_tokens, ignore_eos=True)
    print("| activations | KV cache | mean logprob | mean abs dlogprob | max abs dlogprob "
          "| greedy identical | first difference at |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for act in a.activations:
        runs = {}
        for dt in ["float32", *a.dtypes]:
            llm = LLM(kv_cache_gib=0.25, kv_cache_dtype=dt, activations=act,
                      enable_prefix_caching=False)  # fmt: skip
            ids = [llm._encode([{"role": "user", "content": t}]) for t in texts]
            scored = [[lp for lp, _ in o.prompt_logprobs] for o in llm.generate(ids, score)]
            outs = [o.token_ids for o in llm.generate(ids, greedy)]
            runs[dt] = (scored, outs)
            del llm
        ref_lp, ref_out = runs["float32"]
        mean_ref = statistics.mean(x for row in ref_lp for x in row)
        print(f"| {act} | float32 | {mean_ref:.4f} | - | - | - | - |", flush=True)
        for dt in a.dtypes:
            lp, out = runs[dt]
            pairs = zip(lp, ref_lp, strict=True)
            d = [abs(x - y) for a_, b_ in pairs for x, y in zip(a_, b_, strict=True)]
            same = sum(o == r for o, r in zip(out, ref_out, strict=True))
            first = [
                next((i for i, (x, y) in enumerate(zip(o, r, strict=True)) if x != y), None)
                for o, r in zip(out, ref_out, strict=True)
            ]
            diverged = sorted(f for f in first if f is not None)
            mean = statistics.mean(x for row in lp for x in row)
            print(
                f"| {act} | {dt} | {mean:.4f} | {statistics.mean(d):.2e} | {max(d):.2e} "
                f"| {same} of {len(out)} | {diverged} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
