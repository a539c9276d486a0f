"""A random-weight Llama folder for the GPU check (nothing can be downloaded on the device):
`8b`, shaped like Llama-3.1-8B (hidden 4096, 32 layers, 32/8 heads, bf16, ~7.4 B parameters with
the embedded tokenizer's 49,152-token vocabulary), or `tiny` (the same code on a CPU in a
second). The tokenizer comes from `prepare.py`'s `tok/`.

    python benchmarks/gpu/make_model.py OUT_DIR 8b|tiny [--tok DIR]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
               rope_theta=500000.0),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048),
}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("shape", choices=sorted(SHAPES))
    ap.add_argument("--tok", type=Path, default=Path(__file__).resolve().parent / ".carry/tok")
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and args.shape == "8b"
    cfg = LlamaConfig(vocab_size=49152, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2, **SHAPES[args.shape])  # fmt: skip
    cfg.architectures = ["LlamaForCausalLM"]
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16 if cuda else torch.float32)
    with torch.no_grad():
        for p in model.parameters():  # small weights: activations stay finite through 32 layers
            p.normal_(0, 0.02) if p.dim() > 1 else p.fill_(1.0)
    model.save_pretrained(args.out, safe_serialization=True, max_shard_size="20GB")
    for f in args.tok.iterdir():
        shutil.copy(f, args.out / f.name)
    n = sum(p.numel() for p in model.parameters()) / 1e9
    print(f"{args.shape}: {n:.2f} B parameters, saved in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
