"""tierserve's quantized GEMM against torch's own weight-only CPU matmuls, on this machine.

Issue 20 asks to prefer well-kept kernels and to write our own only where they lose, measured.
For each weight shape of the embedded model (SmolLM2-135M: q/k/v, gate/up, down, the vocabulary
head) and each row count, this times ``out = x @ W`` with float32 activations through:

* ``ts q4_1`` / ``ts q4_1 bf16``: tierserve's kernel on the GGUF's own Q4_1 blocks (float32
  products, or bf16 products with float32 sums where the CPU has AVX512_BF16);
* ``ts q8_0`` / ``ts q8_0 bf16``: the same for Q8_0 blocks;
* ``aten int8``: ``torch._weight_int8pack_mm`` (int8 with one scale per output channel: not the
  GGUF's 32-weight blocks, so a requantization);
* ``aten int4``: ``torch._weight_int4pack_mm_for_cpu`` (int4, groups of 32 with a scale and a
  zero point: Q4_1's layout, with bf16 scales);
* ``aten dyn4``: ``torch.ops.aten._dyn_quant_matmul_4bit`` (int4 weights, activations quantized
  per row at run time), where this build of torch offers it;
* ``mkl f32``: ``torch.mm`` on the dequantized float32 weight (the memory it takes: 4-8x).

Median of interleaved repetitions, milliseconds, at the threads torch uses (2 on the dev VM).

    .venv/bin/python benchmarks/kernels/quant_kernels_vs_torch.py [--rows 1 8 32 128] [--reps 30]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time

import torch

from tierserve import kernels
from tierserve.model import quant

SHAPES = {  # name: (K, N) of the embedded model
    "qkv 576x960": (576, 960),
    "gate_up 576x3072": (576, 3072),
    "down 1536x576": (1536, 576),
    "head 576x49152": (576, 49152),
}


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if "Model name" in ln), "?")


def candidates(k: int, n: int, ext) -> dict:
    torch.manual_seed(0)
    w = torch.randn(n, k) * 0.05  # [out, in]
    fns = {}
    for fmt in ("q4_1", "q8_0"):
        qt = quant.quantize(w, fmt)
        p = quant.pack(qt)
        for bf16 in (False, True):
            qw = ext.QWeight(quant.KERNEL_FORMAT[fmt], p.q, p.d, p.m, bf16)
            if bf16 and not qw.bf16:
                continue

            def run(x, out, qw=qw):
                ext.weight_linear_into(x, qw, None, out, False)

            fns[f"ts {fmt}" + (" bf16" if bf16 else "")] = ("out", run)
    # aten int8: per-channel symmetric int8
    scale = w.abs().amax(1).clamp(min=1e-8) / 127
    w8 = torch.round(w / scale[:, None]).clamp(-128, 127).to(torch.int8)
    fns["aten int8"] = ("ret", lambda x: torch._weight_int8pack_mm(x, w8, scale))
    # aten int4: groups of 32, scale and zero point (Q4_1's shape)
    try:
        g = w.reshape(n, k // 32, 32)
        lo, hi = g.amin(-1), g.amax(-1)
        s = ((hi - lo) / 15).clamp(min=1e-8)
        q = torch.round((g - lo[..., None]) / s[..., None]).clamp(0, 15).to(torch.int32)
        q = q.reshape(n, k)
        packed = torch._convert_weight_to_int4pack_for_cpu(q, 2)
        zeros = lo + 8 * s  # torch's int4: w = (q - 8) * scale + zero
        sz = torch.stack([s.t(), zeros.t()], -1).contiguous()  # [K/32, N, 2]
        torch._weight_int4pack_mm_for_cpu(torch.randn(2, k), packed, 32, sz)
        fns["aten int4"] = ("ret", lambda x: torch._weight_int4pack_mm_for_cpu(x, packed, 32, sz))
    except (RuntimeError, AttributeError) as e:
        print(f"  (aten int4 unavailable: {str(e).splitlines()[0][:90]})")
    try:
        # symmetric int4 blocks of 32 (the op's format), one float32 scale per block
        s4 = (w.reshape(n, k // 32, 32).abs().amax(-1) / 7).clamp(min=1e-8)
        q4 = torch.round(w.reshape(n, k // 32, 32) / s4[..., None]).clamp(-8, 7) + 8
        w4 = q4.reshape(n, k).to(torch.uint8)
        pk = torch.ops.aten._dyn_quant_pack_4bit_weight(
            w4, s4.contiguous(), torch.zeros(n), 32, k, n
        )
        torch.ops.aten._dyn_quant_matmul_4bit(torch.randn(2, k), pk, 32, k, n)
        fns["aten dyn4"] = (
            "ret",
            lambda x: torch.ops.aten._dyn_quant_matmul_4bit(x, pk, 32, k, n),
        )
    except (RuntimeError, AttributeError, NotImplementedError) as e:
        print(f"  (aten dyn4 unavailable: {str(e).splitlines()[0][:90]})")
    wt = w.t().contiguous()  # [in, out]
    fns["mkl f32"] = ("ret", lambda x: torch.mm(x, wt))
    return fns


def time_all(fns: dict, m: int, k: int, n: int, reps: int) -> dict[str, float]:
    x = torch.randn(m, k)
    out = torch.empty(m, n)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(3):  # warm-up
        for kind, f in fns.values():
            f(x, out) if kind == "out" else f(x)
    for _ in range(reps):  # interleaved
        for name, (kind, f) in fns.items():
            t = time.perf_counter()
            f(x, out) if kind == "out" else f(x)
            times[name].append(time.perf_counter() - t)
    return {name: 1e3 * statistics.median(v) for name, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 128])
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    ext = kernels.get()
    if ext is None:
        raise SystemExit("the compiled kernels are unavailable (TIERSERVE_KERNELS=off?)")
    print(f"CPU: {cpu_model()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    for name, (k, n) in SHAPES.items():
        fns = candidates(k, n, ext)
        print(f"\n{name} (median ms)")
        print(f"{'rows':>5} " + " ".join(f"{c:>13}" for c in fns))
        for m in args.rows:
            t = time_all(fns, m, k, n, args.reps if n < 10000 else max(5, args.reps // 3))
            best = min(t, key=t.get)
            cells = " ".join(f"{t[c]:>12.3f}{'*' if c == best else ' '}" for c in fns)
            print(f"{m:>5} {cells}")


if __name__ == "__main__":
    main()
