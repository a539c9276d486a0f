"""``tierserve bench-engine``: the real engine against transformers' own ``generate``.

For each concurrency N: tierserve serves N closed-loop clients (each sends its next request as
soon as the last finishes; 128-token prompts, all distinct, 64 output tokens, greedy) for
``rounds`` requests per client; transformers runs ``generate`` on a static batch of N of the same
prompts. Output tokens/s and time per step are printed for both, in one run, on the same model,
machine and thread count, with a roofline estimate of a decode step against the machine's
measured matmul peak and memory bandwidth.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass

import torch

from tierserve.engine.args import EngineArgs
from tierserve.engine.builder import build_engine
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams


@dataclass
class BenchRow:
    system: str
    concurrency: int
    output_tokens: int
    seconds: float
    step_ms_median: float

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def machine_peaks(seconds: float = 1.0) -> tuple[float, float]:
    """(fp32 matmul FLOP/s, memory copy bytes/s) measured here."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        n += 1
    flops = 2 * 1024**3 * n / (time.perf_counter() - t0)
    src = torch.empty(512 << 20, dtype=torch.uint8)  # well past any cache
    dst = torch.empty_like(src)
    dst.copy_(src)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        dst.copy_(src)
        n += 1
    bw = 2 * src.numel() * n / (time.perf_counter() - t0)  # read + write
    return flops, bw


def _prompts(n: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(length)] for _ in range(n)]


def run_tierserve(built, concurrency: int, rounds: int, prompt_len: int, out_len: int) -> BenchRow:
    eng = built.engine
    prompts = _prompts(concurrency * rounds, prompt_len, built.model_config.vocab_size, seed=7)
    sp = SamplingParams(temperature=0.0, max_tokens=out_len, ignore_eos=True)
    next_id = 0

    def submit() -> None:
        nonlocal next_id
        eng.add_request(
            Request(f"b{concurrency}-{next_id}", prompts[next_id], sp, arrival_time=eng.clock.now())
        )
        next_id += 1

    for _ in range(concurrency):
        submit()
    steps, tokens = [], 0
    t0 = time.perf_counter()
    while eng.has_unfinished():
        s0 = time.perf_counter()
        changed = eng.step()
        steps.append(time.perf_counter() - s0)
        for r in changed:
            if r.output_token_ids:
                tokens += 1
            if r.is_finished and next_id < len(prompts):
                submit()
    dt = time.perf_counter() - t0
    return BenchRow("tierserve", concurrency, tokens, dt, 1e3 * statistics.median(steps))


def run_transformers(hf, concurrency: int, prompt_len: int, out_len: int, vocab: int) -> BenchRow:
    ids = torch.tensor(_prompts(concurrency, prompt_len, vocab, seed=7))
    kw = dict(max_new_tokens=out_len, min_new_tokens=out_len, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        hf.generate(ids[:1, :8], max_new_tokens=2, do_sample=False, pad_token_id=0)  # warm-up
        t0 = time.perf_counter()
        hf.generate(ids, **kw)
        dt = time.perf_counter() - t0
    return BenchRow("transformers", concurrency, concurrency * out_len, dt, 1e3 * dt / out_len)


def build_hf(c, weights):
    """transformers' LlamaForCausalLM for model config `c` with `weights` (default attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=c.vocab_size,
            hidden_size=c.hidden_size,
            intermediate_size=c.intermediate_size,
            num_hidden_layers=c.num_layers,
            num_attention_heads=c.num_heads,
            num_key_value_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            rope_theta=c.rope_theta,
            rms_norm_eps=c.rms_norm_eps,
            max_position_embeddings=c.max_position_embeddings,
            tie_word_embeddings=c.tie_word_embeddings,
        )
    )
    hf.load_state_dict(weights, strict=False)
    return hf.eval()


def roofline(
    config,
    batch: int,
    context: int,
    flops_peak: float,
    bw_peak: float,
    dtype_bytes: int = 4,
    weight_bytes: int | None = None,
) -> dict:
    """A decode step of `batch` requests at `context` tokens each: KV at `dtype_bytes`, the
    weights at `weight_bytes` (their real size: quantized weights are read as stored)."""
    params = config.num_parameters() - config.vocab_size * config.hidden_size  # no lookup
    if config.tie_word_embeddings:
        params += config.vocab_size * config.hidden_size  # the tied head is a matmul
    attn = 4 * config.num_layers * config.num_heads * config.head_dim * context
    flops = batch * (2 * params + attn)
    weight_bytes = weight_bytes if weight_bytes is not None else dtype_bytes * params
    kv_bytes = batch * context * config.kv_bytes_per_token(dtype_bytes)
    t_compute, t_memory = flops / flops_peak, (weight_bytes + kv_bytes) / bw_peak
    return {
        "gflop": flops / 1e9,
        "mbytes": (weight_bytes + kv_bytes) / 1e6,
        "bound_ms": 1e3 * max(t_compute, t_memory),
        "bound": "compute" if t_compute > t_memory else "memory",
    }


def run_engine_bench(
    concurrencies=(1, 8, 32, 64),
    rounds: int = 2,
    prompt_len: int = 128,
    out_len: int = 64,
    with_transformers: bool = True,
    dtype: str | None = None,
    quantization: str = "auto",
    activations: str = "auto",
    max_num_batched_tokens: int = 2048,
    model: str | None = None,
    tokenizer: str | None = None,
) -> tuple[list[BenchRow], dict]:
    """`model` (a GGUF file or model folder; None: the embedded model) and its `tokenizer`."""
    from tierserve.model.loader import load_model

    built = build_engine(
        EngineArgs(
            model=model,
            tokenizer=tokenizer,
            kv_cache_gib=1.0,
            max_num_seqs=max(concurrencies),
            max_num_batched_tokens=max_num_batched_tokens,
            dtype=dtype,
            quantization=quantization,
            activations=activations,
        )
    )
    rows = []
    hf = (
        build_hf(built.model_config, load_model(model, tokenizer).state_dict())
        if with_transformers
        else None
    )
    for n in concurrencies:
        rows.append(run_tierserve(built, n, rounds, prompt_len, out_len))
        if hf is not None:
            rows.append(run_transformers(hf, n, prompt_len, out_len, built.model_config.vocab_size))
    flops, bw = machine_peaks()
    ctx = prompt_len + out_len // 2
    info_bytes = built.executor.model.weight_bytes()
    kv = built.executor.model.kv_dtype
    info = {
        "threads": torch.get_num_threads(),
        "flops_peak": flops,
        "bw_peak": bw,
        "dtype": str(built.executor.model.dtype).replace("torch.", ""),
        "kv_cache_dtype": str(kv).replace("torch.", ""),
        "roofline": {
            n: roofline(built.model_config, n, ctx, flops, bw, kv.itemsize, info_bytes)
            for n in concurrencies
        },
        "model": built.model_name,
        "weights": built.executor.model.weights_summary,
        "weight_bytes": built.executor.model.weight_bytes(),
    }
    return rows, info


def format_report(rows: list[BenchRow], info: dict) -> str:
    lines = [
        f"model {info['model']}, {info['threads']} threads; measured peak "
        f"{info['flops_peak'] / 1e9:.0f} GFLOP/s fp32 matmul, "
        f"{info['bw_peak'] / 1e9:.1f} GB/s copy",
        f"{'system':<14}{'conc':>6}{'out tok':>9}{'seconds':>9}{'tok/s':>9}{'step ms':>9}",
    ]
    for r in rows:
        lines.append(
            f"{r.system:<14}{r.concurrency:>6}{r.output_tokens:>9}{r.seconds:>9.2f}"
            f"{r.tokens_per_s:>9.1f}{r.step_ms_median:>9.1f}"
        )
    lines += [
        f"weights: {info['weights']}",
        f"roofline of one decode step (weights as stored + {info['dtype']} KV read, against the "
        "fp32 matmul peak; context = prompt + out/2):",
    ]
    for n, r in info["roofline"].items():
        lines.append(
            f"  batch {n:>3}: {r['gflop']:.1f} GFLOP, {r['mbytes']:.0f} MB -> >= "
            f"{r['bound_ms']:.1f} ms ({r['bound']}-bound)"
        )
    return "\n".join(lines)
