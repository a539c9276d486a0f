"""Prompt logprobs (what `echo` + `logprobs` + `max_tokens: 0` return, i.e. lm-evaluation-
harness's log-likelihood) against transformers on the embedded model: the largest difference of
one token's logprob and of a whole text's sum, over a few texts, with prompts computed whole and
in chunks (a small `--chunk` forces chunked prefill), for each `--activations` (the quantized
kernels' products: the CPU's default, int8 on VNNI / AVX2, rounds each row's activations).
Run:

    .venv/bin/python benchmarks/quality/logprob_parity.py --chunk 64 --activations int8 float32
"""

from __future__ import annotations

import argparse

import torch

from tierserve import LLM
from tierserve.bench.engine_bench import build_hf
from tierserve.model.loader import load_model
from tierserve.sampling_params import SamplingParams

TEXTS = [
    "The capital of France is Paris.",
    "Question: What is two plus two?\nAnswer: Four, of course.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    " ".join(f"Line {i}: the quick brown fox jumps over the lazy dog." for i in range(20)),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunk", type=int, default=64, help="max_num_batched_tokens")
    ap.add_argument("--activations", nargs="+", default=["auto"], help="products, each in turn")
    args = ap.parse_args()
    loaded = load_model()
    hf = build_hf(loaded.config, loaded.state_dict())
    ids = [loaded.tokenizer.encode(t) for t in TEXTS]
    want = []
    for p in ids:
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([p])).logits[0].double(), -1)
        want.append(ref[torch.arange(len(p) - 1), torch.tensor(p[1:])])
    n = sum(len(p) for p in ids)
    for act in args.activations:
        llm = LLM(kv_cache_gib=0.25, max_num_batched_tokens=args.chunk, activations=act)
        outs = llm.generate(ids, SamplingParams(max_tokens=0, prompt_logprobs=0))
        tok_err, sum_err = 0.0, 0.0
        for w, o in zip(want, outs, strict=True):
            got = torch.tensor([lp for lp, _ in o.prompt_logprobs], dtype=torch.float64)
            tok_err = max(tok_err, float((got - w).abs().max()))
            sum_err = max(sum_err, abs(float(got.sum() - w.sum())))
        print(
            f"--activations {act} ({llm.executor.model.weights_summary}): {len(TEXTS)} texts, "
            f"{n} tokens, chunks of {args.chunk}: max |difference| per token {tok_err:.2e}, "
            f"per text sum {sum_err:.2e} (nats)"
        )


if __name__ == "__main__":
    main()
