"""Quality of a precision, measured: perplexity on a fixed text and greedy answers to a fixed
prompt set (both in ``bench/data/``), for each ``--quantization`` against float32 on the same
file's weights.

    tierserve bench-quality [--quantization auto none q8_0 q4_0] [--max-tokens 48]

Perplexity runs the model over the text in chunks (each chunk attends to every earlier token
through the KV cache, as serving does) and averages the negative log-likelihood of every token
after the first. The tests (`tests/test_quant.py`) call the same functions.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

DATA = Path(__file__).parent / "data"


def quality_text() -> str:
    return (DATA / "quality.txt").read_text()


def quality_prompts() -> list[str]:
    return json.loads((DATA / "quality_prompts.json").read_text())


@torch.inference_mode()
def perplexity(model, ids: list[int], chunk: int = 256, block_size: int = 16, plan=None) -> float:
    """exp(mean NLL) of ids[1:] given their prefixes, through the paged KV path (`plan`: the
    serving executor's step plan; default: the model's default plan)."""
    from tierserve.executor.batch import build_batch
    from tierserve.executor.state import RequestState
    from tierserve.executor.torch_executor import TorchExecutor
    from tierserve.model.plan import uses_blas
    from tierserve.sampling_params import SamplingParams

    blocks = -(-len(ids) // block_size)
    ex = TorchExecutor(model, num_blocks=blocks, block_size=block_size, measure=False)
    ex.plan = plan or ex.plan
    st = RequestState(list(ids), len(ids), list(range(blocks)), 0, SamplingParams(max_tokens=1))
    ex.add_state("ppl", st)
    nll, count = 0.0, 0
    while st.num_computed < len(ids):
        n = min(chunk, len(ids) - st.num_computed)
        path = ex.plan.path(n)
        b = build_batch(
            {"ppl": st}, {"ppl": n}, block_size, ex.tables, model.backend(path),
            fused=path == "fused",
        )  # fmt: skip
        rows = torch.arange(n)
        blas = uses_blas(path)
        logits = model.forward(b.input_ids, b.positions, b.meta, ex.kv_caches, rows, blas=blas)
        start = st.num_computed
        targets = torch.tensor(ids[start + 1 : start + n + 1])
        lp = torch.log_softmax(logits[: len(targets)].double(), -1)
        nll -= lp.gather(1, targets[:, None]).sum().item()
        count += len(targets)
        st.num_computed += n
    return math.exp(nll / count)


@dataclass
class QualityRow:
    quantization: str
    weights: str
    perplexity: float
    answers: list[str]


def measure(
    quantization: str,
    max_tokens: int = 48,
    activations: str = "float32",
    path: str | None = None,
    kv_cache_dtype: str = "float32",
) -> QualityRow:
    """`path`: every step through that step path (`model/plan.py`), else the default plan.
    The KV cache is float32 unless `kv_cache_dtype` says otherwise (the row is labelled)."""
    from tierserve.llm import LLM
    from tierserve.model.plan import NEVER, StepPlan
    from tierserve.sampling_params import SamplingParams

    llm = LLM(
        quantization=quantization,
        activations=activations,
        kv_cache_gib=0.1,
        measure_costs=False,
        kv_cache_dtype=kv_cache_dtype,
    )
    model = llm.executor.model
    if path is not None:
        llm.executor.plan = StepPlan(((NEVER, path),), f"--step-path {path}")
        model.use_plan(llm.executor.plan)
    ppl = perplexity(model, llm.tokenizer.encode(quality_text()), plan=llm.executor.plan)
    msgs = [[{"role": "user", "content": p}] for p in quality_prompts()]
    outs = llm.generate(msgs, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    products = next((p for p in ("bf16", "int8") if f"{p} products" in model.weights_summary), None)
    label = quantization + (f"+{products}" if products else "") + (f"@{path}" if path else "")
    kv = str(model.kv_dtype).removeprefix("torch.")
    label += "" if kv == "float32" else f" kv:{kv}"
    return QualityRow(label, model.weights_summary, ppl, [o.text for o in outs])


def format_table(rows: list[QualityRow], reference: str = "none") -> str:
    ref = next((r for r in rows if r.quantization == reference), rows[0])
    lines = [
        f"{'quantization':<24}{'weights':<28}{'perplexity':>11}{'vs ' + ref.quantization:>10}"
        f"{'same answers':>14}",
    ]
    for r in rows:
        same = sum(a == b for a, b in zip(r.answers, ref.answers, strict=True))
        lines.append(
            f"{r.quantization:<24}{r.weights:<28}{r.perplexity:>11.3f}"
            f"{100 * (r.perplexity / ref.perplexity - 1):>+9.2f}%{same:>8} / {len(r.answers)}"
        )
    return "\n".join(lines)
