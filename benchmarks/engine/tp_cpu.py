"""Tensor parallelism on the CPU: the same random Llama-shaped model at TP=1 and TP=N, in
process (`tierserve.LLM`), the machine's threads shared out between the ranks.

Three figures per TP size: a lone request's decode (output tokens/s), eight requests decoding
together (output tokens/s), one prompt's prefill (seconds). Greedy, `ignore_eos`, each timed
after a warm-up run. On one socket TP splits the same cores and memory bandwidth, and adds two
all-reduces a layer (gloo, through loopback TCP): it is not expected to be faster; this measures
what it costs (issue 44).

    python benchmarks/engine/tp_cpu.py --tp 1 2 --out /tmp/tp_cpu.json
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch
import transformers

from tierserve import LLM
from tierserve.sampling_params import SamplingParams

SHAPE = dict(  # 12 heads / 4 KV heads of 64, 12 layers: divides by 2 and 4 (about 150M params)
    vocab_size=32000,
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)


def save_model(folder: Path) -> None:
    """Random weights and a word-per-id tokenizer (token ids are what is measured)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    cfg = transformers.LlamaConfig(**SHAPE)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).float().save_pretrained(folder)
    vocab = {f"w{i}": i for i in range(SHAPE["vocab_size"])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.save(str(folder / "tokenizer.json"))


def timed(llm: LLM, prompts, params: SamplingParams) -> float:
    llm.generate(prompts, params)  # warm-up: the same shapes
    t0 = time.perf_counter()
    llm.generate(prompts, params)
    return time.perf_counter() - t0


def measure(folder: Path, tp: int, threads: int, quantization: str) -> dict:
    def prompt(i: int, n: int) -> list[int]:
        return [(i * 7919 + j * 104729) % 31000 + 500 for j in range(n)]

    out = {"tp": tp}
    with LLM(
        model=str(folder),
        tensor_parallel_size=tp,
        cpu_threads=threads,
        quantization=quantization,
        kv_cache_gib=0.5,
        enable_prefix_caching=False,
    ) as llm:
        new = 64
        decode = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)
        s = timed(llm, [prompt(0, 128)], decode)
        out["lone_decode_tok_s"] = round(new / s, 1)
        s = timed(llm, [prompt(i, 128) for i in range(8)], decode)
        out["eight_decode_tok_s"] = round(8 * new / s, 1)
        one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
        out["prefill_512_s"] = round(timed(llm, [prompt(9, 512)], one), 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads(), help="in all")
    ap.add_argument("--quantization", default="none", help="none (float32) or q8_0")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d) / "llama-150m"
        save_model(folder)
        rows = [measure(folder, tp, a.threads, a.quantization) for tp in a.tp]
    result = {
        "machine": platform.processor() or platform.machine(),
        "threads": a.threads,
        "quantization": a.quantization,
        "shape": SHAPE,
        "rows": rows,
    }
    print("| TP | lone decode tok/s | 8 decoding tok/s | 512-token prefill s |")
    print("|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['tp']} | {r['lone_decode_tok_s']} | {r['eight_decode_tok_s']} | "
            f"{r['prefill_512_s']} |"
        )
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
