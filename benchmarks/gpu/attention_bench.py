"""Decode attention on CUDA, one layer of an 8B shape (32 query heads, 8 KV heads, head 128,
16-token blocks, bf16 cache): the Triton kernel reading blocks in place against the PyTorch
reference gathering each context, at batch 1 / 8 / 64 / 256 and context 1,024. Median ms of
CUDA-event-timed calls; one JSON line.

    python benchmarks/gpu/attention_bench.py [--batches 1 8 64 256] [--context 1024]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

from tierserve.model.attention.base import PLAIN
from tierserve.model.attention.torch_paged import TorchMetadata, TorchPagedAttention
from tierserve.model.attention.triton_paged import paged_decode, triton_available

H, HKV, D, BS = 32, 8, 128, 16


def timed(fn, reps: int = 20) -> float:
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    ap.add_argument("--context", type=int, default=1024)
    args = ap.parse_args()
    if not torch.cuda.is_available() or not triton_available():
        print("attention_bench: needs CUDA and Triton (run it on a GPU machine)", file=sys.stderr)
        return 2
    dev, width = torch.device("cuda"), -(-args.context // BS)
    rows = []
    for b in args.batches:
        blocks = b * width + 1
        k = torch.randn(HKV, blocks, BS, D, device=dev, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        q = torch.randn(b, H, D, device=dev, dtype=torch.bfloat16)
        tables = torch.randperm(blocks - 1, device=dev)[: b * width].view(b, width)
        lens = torch.full((b,), args.context, dtype=torch.long, device=dev)
        meta = TorchMetadata(
            TorchPagedAttention(), lens, decode_rows=torch.arange(b, device=dev),
            decode_blocks=tables.reshape(-1), decode_lens=lens, decode_width=width * BS,
            dtype=torch.bfloat16,
        )  # fmt: skip
        ref = TorchPagedAttention()._decode(q, k, v, meta, PLAIN)
        got = paged_decode(q, k, v, tables, lens, PLAIN)
        rows.append({
            "batch": b, "context": args.context,
            "triton_ms": timed(lambda: paged_decode(q, k, v, tables, lens, PLAIN)),  # noqa: B023
            "torch_ms": timed(lambda: TorchPagedAttention()._decode(q, k, v, meta, PLAIN)),  # noqa: B023
            "max_abs_diff": (got.float() - ref.float()).abs().max().item(),
        })  # fmt: skip
        meta._bias.clear()
    print(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
