"""Measure the torch executor on a GPU: the ground truth for the simulator's GPU profiles.

A randomly initialised Llama-3.1-8B-shaped model (no weights can be fetched on the device
machine) runs in bfloat16 through the real TorchExecutor:

1. accuracy: bf16 logits against a float32 copy of the same weights (relative error);
2. step times (median of several, CUDA-synchronised) over batch compositions: prefill chunks,
   decode batches at several context lengths, and mixes;
3. the cost model's prediction for the same steps with the shipped profile, and the compute and
   memory efficiencies that would make it match (fitted on prefill-only and decode-only steps).

Writes ``$OUT/gpu_profile.json`` (or ``--out``) and prints a table. One script, one run:

    python benchmarks/gpu/gpu_profile.py --out "$OUT/gpu_profile.json"       # on the device
    python benchmarks/gpu/gpu_profile.py --tiny --device cpu                   # smoke test here
    python benchmarks/gpu/gpu_profile.py --decode-only --batches 1 8 64 256 --decode-graphs capture
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from tierserve.executor.state import RequestState
from tierserve.executor.torch_executor import TorchExecutor
from tierserve.model.config import ModelConfig
from tierserve.model.llama import LlamaModel
from tierserve.model.plan import uses_blas
from tierserve.sampling_params import SamplingParams
from tierserve.sim.calibration.profiles import ModelProfile, load_hardware
from tierserve.sim.engine.cost_model import CostModel

LLAMA_8B = ModelConfig(
    architecture="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
    num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
    rms_norm_eps=1e-5, max_position_embeddings=131072, name="llama-3.1-8b-random",
    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
)  # fmt: skip
TINY = ModelConfig(
    architecture="llama", vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2,
    num_heads=4, num_kv_heads=2, head_dim=16, name="tiny-random",
)  # fmt: skip

# (prefill chunk lengths, decode batch, decode context)
COMPOSITIONS = [
    ((512,), 0, 0), ((2048,), 0, 0), ((4096,), 0, 0), ((1024, 1024), 0, 0),
    ((), 1, 1024), ((), 8, 1024), ((), 32, 1024), ((), 64, 1024), ((), 128, 1024),
    ((), 256, 1024), ((), 64, 4096), ((), 256, 2048),
    ((2048,), 64, 1024), ((1024,), 128, 2048), ((512,), 256, 1024),
]  # fmt: skip


def random_weights(cfg: ModelConfig, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(seed)
    h, q, kv, i = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size

    def rnd(*shape):
        return torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * 0.02

    w = {"model.embed_tokens.weight": rnd(cfg.vocab_size, h), "model.norm.weight":
         torch.ones(h, device=device), "lm_head.weight": rnd(cfg.vocab_size, h)}  # fmt: skip
    for layer in range(cfg.num_layers):
        p = f"model.layers.{layer}."
        w[p + "self_attn.q_proj.weight"] = rnd(q, h)
        w[p + "self_attn.k_proj.weight"] = rnd(kv, h)
        w[p + "self_attn.v_proj.weight"] = rnd(kv, h)
        w[p + "self_attn.o_proj.weight"] = rnd(h, q)
        w[p + "mlp.gate_proj.weight"] = rnd(i, h)
        w[p + "mlp.up_proj.weight"] = rnd(i, h)
        w[p + "mlp.down_proj.weight"] = rnd(h, i)
        w[p + "input_layernorm.weight"] = torch.ones(h, device=device)
        w[p + "post_attention_layernorm.weight"] = torch.ones(h, device=device)
    return w


def logits_error(cfg: ModelConfig, device: str, dtype: torch.dtype, n: int = 64) -> float:
    """Max relative logit error of `dtype` against float32 on the same random weights."""
    ids = list(range(10, 10 + n))
    outs = []
    for dt in (torch.float32, dtype):
        model = LlamaModel(cfg, random_weights(cfg, device), device, dt)
        ex = TorchExecutor(model, num_blocks=-(-n // 16) + 1, block_size=16, measure=False)
        st = {"r": RequestState(list(ids), n, list(range(-(-n // 16) + 1)), 0, SamplingParams())}
        ex.add_state("r", st["r"])
        from tierserve.executor.batch import build_batch

        path = ex.plan.path(n)
        b = build_batch(st, {"r": n}, 16, ex.tables, model.backend(path), model.dtype,
                        device=model.device, fused=path == "fused")  # fmt: skip
        outs.append(model.forward(b.input_ids, b.positions, b.meta, ex.kv_caches,
                                  torch.arange(n, device=model.device),
                                  blas=uses_blas(path)))  # fmt: skip
        del model, ex
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    ref, got = outs
    return float((got - ref).abs().max() / ref.abs().max())


def time_steps(ex: TorchExecutor, repeats: int, comps) -> list[dict]:
    sync = torch.cuda.synchronize if ex.model.device.type == "cuda" else (lambda: None)
    sp = SamplingParams(temperature=0.0)
    rows = []
    for prefills, n_dec, ctx in comps:
        times = []
        for _ in range(repeats + 1):  # the first run warms up
            states, sched, chunks, nxt = {}, {}, [], 0
            for k, n in enumerate(prefills):
                nb = -(-(n + 1) // ex.block_size)
                states[f"p{k}"] = RequestState([7] * n, n, list(range(nxt, nxt + nb)), 0, sp)
                nxt += nb
                sched[f"p{k}"] = n
                chunks.append((n, n))
            for k in range(n_dec):
                nb = -(-(ctx + 1) // ex.block_size)
                states[f"d{k}"] = RequestState(
                    [7] * (ctx + 1), ctx, list(range(nxt, nxt + nb)), ctx, sp
                )
                nxt += nb
                sched[f"d{k}"] = 1
                chunks.append((1, ctx + 1))
            for rid, st in states.items():
                ex.add_state(rid, st)
            sync()
            t0 = time.perf_counter()
            ex.forward(states, sched)
            sync()
            times.append(time.perf_counter() - t0)
            for rid in states:
                ex.drop_state(rid)
        rows.append({"prefill": list(prefills), "decode_batch": n_dec, "decode_context": ctx,
                     "chunks": chunks, "seconds": statistics.median(times[1:])})  # fmt: skip
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="a tiny model (smoke test)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hardware", default="h200-141gb", help="profile to compare against")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_profile.json"))
    ap.add_argument(
        "--decode-graphs", default="off", choices=("off", "capture", "eager"),
        help="decode steps from CUDA graphs (capture), their buffers without graphs (eager), off",
    )  # fmt: skip
    ap.add_argument("--decode-only", action="store_true", help="decode batches only (--batches)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64, 256])
    args = ap.parse_args()
    cfg = TINY if args.tiny else LLAMA_8B
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    comps = [((64,), 0, 0), ((), 4, 64), ((32,), 4, 64)] if args.tiny else COMPOSITIONS
    if args.decode_only:
        comps = [((), b, 64 if args.tiny else 1024) for b in args.batches]
    t0 = time.perf_counter()
    err = float("nan")
    if not args.decode_only:
        err = logits_error(cfg, args.device, dtype)
        print(f"{cfg.name}: {dtype} vs float32 max relative logit error {err:.2e}", flush=True)
    model = LlamaModel(cfg, random_weights(cfg, args.device), args.device, dtype)
    need = sum(-(-(n + 1) // 16) for p, _, _ in comps for n in p) + max(
        b * -(-(c + 1) // 16) for _, b, c in comps
    )
    ex = TorchExecutor(
        model, num_blocks=need + 16, block_size=16, measure=True,
        decode_graphs=args.decode_graphs, max_model_len=max(c for _, _, c in comps) + 16,
        max_seqs=max(b for _, b, _ in comps) or 1,
    )  # fmt: skip
    t_graphs = time.perf_counter() - t0
    rows = time_steps(ex, args.repeats, comps)
    hw = load_hardware(args.hardware)
    cost = CostModel(hw, ModelProfile(cfg, torch.empty((), dtype=dtype).element_size()), 1)
    print(f"{'step':<34}{'measured ms':>12}{'model ms':>10}")
    for r in rows:
        r["predicted_seconds"] = cost.step(
            [tuple(c) for c in r["chunks"]], len(r["chunks"])
        ).seconds
        label = f"prefill {r['prefill']} decode {r['decode_batch']}x{r['decode_context']}"
        print(f"{label:<34}{1e3 * r['seconds']:>12.2f}{1e3 * r['predicted_seconds']:>10.2f}")
    report = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__, "model": cfg.name, "dtype": str(dtype),
        "logit_rel_error_vs_fp32": err, "preemption_costs": ex.preemption_costs().__dict__,
        "compared_profile": args.hardware, "steps": rows, "decode_graphs": args.decode_graphs,
        "graph_replays": ex.runner.graphs.replays if ex.runner.graphs else 0,
        "setup_s": t_graphs,
        "wall_s": time.perf_counter() - t0,
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out} in {report['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
