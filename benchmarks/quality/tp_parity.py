"""TP=N against TP=1 on one model: prompt logprobs and greedy answers, per `--activations`.

Tensor parallelism sums each row-parallel product in N parts (one per rank) instead of one: in
float32 the answers move by rounding only; reduced-precision products (bfloat16, int8) round
their inputs again after every layer, so the same small differences move them further, as any
change of summation order does (docs/performance.md#tensor-parallelism).

    python benchmarks/quality/tp_parity.py --tp 3 --activations float32 bfloat16 int8
    python benchmarks/quality/tp_parity.py --model /path/folder --tp 2 --device cuda

Without --model: the embedded SmolLM2-135M (9 heads, 3 KV heads: it splits 3 ways).
"""

from __future__ import annotations

import argparse
import json

from tierserve import LLM
from tierserve.sampling_params import SamplingParams

TEXT = (
    "The capital of France is Paris. It is known for the Eiffel Tower, its museums and the "
    "cafes along the Seine, and for a long history of art, science and revolution."
)
CHATS = [
    [{"role": "user", "content": "What is the capital of France? Answer briefly."}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "List three prime numbers."}],
]


def run(model, tp, activations, device, tokenizer) -> tuple[list[float], list[list[int]]]:
    kw = dict(activations=activations, measure_costs=False, tensor_parallel_size=tp)
    if device:
        kw["device"] = device
    if tokenizer:
        kw["tokenizer"] = tokenizer
    score = SamplingParams(max_tokens=1, prompt_logprobs=0)
    greedy = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    with LLM(model=model, **kw) as llm:
        lps = [p[0] for p in llm.generate([TEXT], score)[0].prompt_logprobs if p is not None]
        prompts = CHATS if tokenizer is None and model is None else [TEXT[:40], TEXT[40:90]]
        answers = [o.token_ids for o in llm.generate(prompts, greedy)]
    return lps, answers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--tp", type=int, default=3)
    ap.add_argument("--device", default=None)
    ap.add_argument("--activations", nargs="+", default=["float32", "bfloat16", "int8"])
    ap.add_argument(
        "--against-float32",
        action="store_true",
        help="also each run's distance from float32 products at TP=1",
    )
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    rows = []
    ref = run(a.model, 1, "float32", a.device, a.tokenizer)[0] if a.against_float32 else None
    for act in a.activations:
        one, ans1 = run(a.model, 1, act, a.device, a.tokenizer)
        many, ansn = run(a.model, a.tp, act, a.device, a.tokenizer)
        if ref is not None:
            for tp, lps in ((1, one), (a.tp, many)):
                d = [abs(x - y) for x, y in zip(ref, lps, strict=True)]
                print(
                    f"--activations {act} at TP={tp} against float32 at TP=1: within "
                    f"{max(d):.3g} nats (sum {sum(d):.3f})"
                )
        diff = max(abs(x - y) for x, y in zip(one, many, strict=True))
        same = sum(x == y for x, y in zip(ans1, ansn, strict=True))
        rows.append(
            {
                "activations": act,
                "tp": a.tp,
                "max_prompt_logprob_diff": diff,
                "prompt_tokens": len(one),
                "greedy_answers_equal": f"{same}/{len(ans1)}",
            }
        )
        print(
            f"--activations {act}: TP={a.tp} vs TP=1: prompt logprobs within {diff:.2g} nats "
            f"over {len(one)} tokens; greedy answers equal {same}/{len(ans1)}",
            flush=True,
        )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
