"""The paged attention kernel on a fresh prompt against PyTorch's SDPA, one layer of the embedded
model's geometry (9 query heads, 3 KV heads, head_dim 64, 16-token blocks), median of 20 calls:

    OMP_NUM_THREADS=1 taskset -c 0 .venv/bin/python \
        benchmarks/kernels/attention_prefill.py [--rows 160 512]

Prompt chunks of 16+ rows run `run_lanes` (kernels/csrc/attention.cpp); the printed max
difference is against SDPA's result.
"""

from __future__ import annotations

import argparse
import subprocess

import torch
import torch.nn.functional as F
from qgemm_products import (
    median_ms,  # a sibling script: python benchmarks/kernels/attention_prefill.py
)

from tierserve import kernels
from tierserve.model.attention.base import tile_k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[160, 512])
    a = ap.parse_args()
    ext = kernels.get()
    if ext is None:
        raise SystemExit("the compiled kernels are unavailable")
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    print(next((ln for ln in cpu.splitlines() if "Model name" in ln), "?"))
    torch.manual_seed(0)
    for rows in a.rows:
        ours, sdpa, diff = one(ext, rows)
        print(f"{rows:5d} rows: kernel {ours:.3f} ms, SDPA {sdpa:.3f} ms, max diff {diff:.1e}")


def one(ext, rows: int, heads: int = 9, kv_heads: int = 3, dim: int = 64, bs: int = 16):
    nb = -(-rows // bs)
    kc, vc = torch.randn(kv_heads, nb, bs, dim), torch.randn(kv_heads, nb, bs, dim)
    q = torch.randn(rows, heads, dim)
    tables = torch.arange(nb, dtype=torch.int32)[None, :].contiguous()
    seg = torch.tensor([[0, rows, 0, 1]], dtype=torch.int32)
    out = torch.empty(rows, heads, dim)
    kt = tile_k(kc, ext.vector_lanes())  # the kernel reads K in its tiles
    ours = median_ms(lambda: ext.paged_attention_into(q, kt, vc, tables, seg, dim**-0.5, out), 20)
    group = heads // kv_heads
    k = kc.reshape(kv_heads, nb * bs, dim)[:, :rows].repeat_interleave(group, 0)[None]
    v = vc.reshape(kv_heads, nb * bs, dim)[:, :rows].repeat_interleave(group, 0)[None]
    qq = q.transpose(0, 1)[None]
    sdpa = median_ms(lambda: F.scaled_dot_product_attention(qq, k, v, is_causal=True), 20)
    ref = F.scaled_dot_product_attention(qq, k, v, is_causal=True)[0].transpose(0, 1)
    return ours, sdpa, (ref - out).abs().max().item()


if __name__ == "__main__":
    main()
