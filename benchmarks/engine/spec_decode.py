"""Speculative decoding at low load: mean TPOT and TTFT of P0 streams, drafts on versus off, in
process on the embedded model (issue 25's first targets).

    .venv/bin/python benchmarks/engine/spec_decode.py [--concurrency 1 4] [--max-tokens 128]
    .venv/bin/python benchmarks/engine/spec_decode.py --draft-model embedded [--free-drafts] ...

For each prompt set (benchmarks/data/grounded_prompts.jsonl: summarise, rewrite, extract, code
edit; open_chat_prompts.jsonl) and each concurrency, the prompts run as greedy P0 chat requests,
`concurrency` at a time, once with `--speculative-config` off and once with the n-gram drafter
(`--draft-model PATH`: with that draft model instead, `embedded` for the embedded GGUF drafting
for itself; `--free-drafts`: the rule prices the draft model's passes at 0 s, so it drafts even
where they cannot pay, to measure what they do).
Reports mean TPOT (first token to last, per request), mean TTFT, tok/s, the acceptance rate,
and whether the outputs were token-identical. `--rounds N` runs the arms N times in turn and
reports medians (this VM's speed moves ~10-30% within minutes: a ratio needs interleaving;
from the second run of a prompt set on, its prompts hit the prefix cache, so TTFT is mostly
the cached one);
`--class-rule` adds an arm whose rule reads only its class's acceptance, not each request's own
recent acceptance (`Speculation.acceptance_of`), the rule before 3a05f76. One process, one
engine at a time: run it on a quiet machine and name the CPU (`lscpu`) beside the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from tierserve.core.speculation import SpecConfig
from tierserve.llm import LLM
from tierserve.model.loader import default_model_path
from tierserve.priority import Priority
from tierserve.request import Request
from tierserve.sampling_params import SamplingParams

DATA = Path(__file__).resolve().parents[1] / "data"


def load(name: str) -> list[str]:
    return [json.loads(line)["prompt"] for line in (DATA / name).read_text().splitlines()]


def run(llm: LLM, prompts: list[str], concurrency: int, max_tokens: int) -> dict:
    eng, eos = llm.engine, llm.model_config.eos_token_ids
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    queue = [llm._encode([{"role": "user", "content": p}]) for p in prompts]
    live: list[Request] = []
    done: list[Request] = []
    # (batch, prefill tokens, tokens, execute s, tokens emitted)
    steps: list[tuple[int, int, int, float, int]] = []
    n = 0
    t0 = time.perf_counter()
    while queue or live:
        while queue and len(live) < concurrency:
            req = Request(
                f"b{n}", queue.pop(0), params, priority=Priority.P0,
                arrival_time=eng.clock.now(), eos_token_id=eos[0] if eos else None,
            )  # fmt: skip
            n += 1
            eng.add_request(req)
            live.append(req)
        eng.step()
        st = eng.last_stats
        if st is not None and not st.cut_in:
            extra = sum(e - v for _, _, e, v in st.spec.step) if st.spec else 0
            steps.append(
                (st.batch_size, st.num_prefill_tokens, st.num_tokens, st.execute_s,
                 st.batch_size + extra)
            )  # fmt: skip
        for r in [r for r in live if r.is_finished]:
            live.remove(r)
            done.append(r)
    wall = time.perf_counter() - t0
    tpot = [
        (r.finished_time - r.first_token_time) / (r.num_output_tokens - 1)
        for r in done
        if r.num_output_tokens > 1
    ]
    ttft = [r.first_token_time - r.arrival_time for r in done]
    return {
        "tpot_ms": 1e3 * statistics.mean(tpot),
        "ttft_ms": 1e3 * statistics.mean(ttft),
        "tok_s": sum(r.num_output_tokens for r in done) / wall,
        "outputs": {r.request_id: list(r.output_token_ids) for r in done},
        "steps": steps,
    }


def row_cost(off: list[dict], on: list[dict], batch: int) -> str:
    """What a verified draft row costs at this batch, against what issue 25's 1.6x would allow.

    Only decode steps with every stream in them count (no prefill tokens, `batch` requests).
    T0: the median plain step (drafts off). The drafted steps' time is fitted as a + c x D
    (least squares over steps, D the step's draft rows), c being one verified draft row's cost.
    With the drafts as proposed (their mean D a step, yielding Y tokens a step in all), decode
    steps alone give (T0 / batch) / (mean step / Y) lower TPOT, and 1.6x would need
    c <= (T0 Y / (1.6 batch) - a) / D."""
    plain = [s[3] for r in off for s in r["steps"] if s[0] == batch and s[1] == 0]
    pts = [s for r in on for s in r["steps"] if s[0] == batch and s[1] == 0]
    if len(plain) < 3 or len(pts) < 3:
        return "too few full decode steps"
    t0 = statistics.median(plain)
    xs, ys = [s[2] - s[0] for s in pts], [s[3] for s in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    c = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    a = my - c * mx
    yield_ = statistics.fmean(s[4] for s in pts)
    need = (t0 * yield_ / (1.6 * batch) - a) / mx if mx else float("nan")
    return (
        f"plain step {1e3 * t0:.2f} ms ({len(plain)} steps); drafted steps ({len(pts)}): "
        f"{1e3 * a:.2f} ms + {1e3 * c:.3f} ms a draft row, {mx:.1f} draft rows and "
        f"{yield_:.2f} tokens a step; decode steps alone {(t0 / batch) / (my / yield_):.2f}x; "
        f"1.6x needs <= {1e3 * need:.3f} ms a row"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--sets", nargs="+", default=["grounded_prompts", "open_chat_prompts"])
    ap.add_argument("--activations", default="auto", help="auto (bf16 here) | float32")
    ap.add_argument("--draft-model", default=None, help="a draft model's path, or 'embedded'")
    ap.add_argument("--free-drafts", action="store_true", help="price draft passes at 0 s")
    ap.add_argument(
        "--quantization", default="auto", help="the target's (none: float32 weights; the draft "
        "model keeps its own precision)"
    )  # fmt: skip
    ap.add_argument("--kv-cache-dtype", default="auto", help="auto (the model's) | float16 | ...")
    ap.add_argument(
        "--rounds", type=int, default=1,
        help="run every arm this many times, interleaved, and report the medians"
    )  # fmt: skip
    ap.add_argument(
        "--class-rule", action="store_true",
        help="a third arm whose rule reads only its class's acceptance, not the request's own"
    )  # fmt: skip
    ap.add_argument(
        "--steps", action="store_true",
        help="also report a verified draft row's cost and what 1.6x would need (row_cost)"
    )  # fmt: skip
    a = ap.parse_args()
    draft = str(default_model_path()) if a.draft_model == "embedded" else a.draft_model

    def engine(spec: bool) -> LLM:
        return LLM(
            kv_cache_gib=0.5,
            kv_cache_dtype=a.kv_cache_dtype,
            activations=a.activations,
            quantization=a.quantization,
            speculative_config=SpecConfig(num_speculative_tokens=a.k) if spec else None,
            speculative_model=draft if spec else None,
        )

    engines = {"off": engine(False), "on": engine(True)}
    if a.class_rule:  # the rule before per-request acceptance (Speculation.acceptance_of)
        engines["class"] = engine(True)
        sp = engines["class"].engine.scheduler.speculation
        sp.acceptance_of = lambda req, sp=sp: sp.acceptance(req.base_priority)
    arms = [name for name in engines if name != "off"]
    drafter = engines["on"].engine.executor.drafter
    if drafter is not None:
        print(f"draft model {draft}: one pass {1e3 * drafter.pass_s:.1f} ms at start")
        if a.free_drafts:
            for arm in arms:
                engines[arm].engine.scheduler.speculation.draft_pass_s = lambda: 0.0
    for llm in engines.values():  # warm every engine (autotune, first steps)
        run(llm, load("open_chat_prompts.jsonl")[:2], 2, 16)
    print(
        "| prompts | clients | rule | TPOT off (ms) | TPOT on (ms) | TPOT gain "
        "| TTFT off / on (ms) | tok/s off / on | acceptance | identical |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in a.sets:
        prompts = load(f"{name}.jsonl")
        for c in a.concurrency:
            results: dict[str, list[dict]] = {arm: [] for arm in engines}
            counts = {arm: [0, 0] for arm in arms}
            for _ in range(a.rounds):
                for arm, llm in engines.items():
                    spec = llm.engine.scheduler.speculation
                    if spec is None:
                        results[arm].append(run(llm, prompts, c, a.max_tokens))
                        continue
                    before = (sum(spec.counts.drafted), sum(spec.counts.accepted))
                    results[arm].append(run(llm, prompts, c, a.max_tokens))
                    counts[arm][0] += sum(spec.counts.drafted) - before[0]
                    counts[arm][1] += sum(spec.counts.accepted) - before[1]
            off = _median(results["off"])
            for arm in arms:
                on = _median(results[arm])
                drafted, accepted = counts[arm]
                # round by round: from the second round on, prompts hit the prefix cache, whose
                # chunking may sum in another order (a different argmax now and then, issue 20)
                same = all(
                    r["outputs"] == o["outputs"]
                    for r, o in zip(results[arm], results["off"], strict=True)
                )
                print(
                    f"| {name} | {c} | {'request' if arm == 'on' else 'class'} "
                    f"| {off['tpot_ms']:.1f} | {on['tpot_ms']:.1f} "
                    f"| {off['tpot_ms'] / on['tpot_ms']:.2f}x "
                    f"| {off['ttft_ms']:.0f} / {on['ttft_ms']:.0f} "
                    f"| {off['tok_s']:.1f} / {on['tok_s']:.1f} "
                    f"| {accepted / drafted if drafted else 0:.2f} ({drafted} drafts) | {same} |",
                    flush=True,
                )
                if a.steps and drafted:
                    print(f"  {arm}, {c} clients: " + row_cost(
                        results["off"], results[arm], c
                    ), flush=True)  # fmt: skip


def _median(runs: list[dict]) -> dict:
    """The median of each figure over interleaved runs of one arm."""
    return {k: statistics.median(r[k] for r in runs) for k in ("tpot_ms", "ttft_ms", "tok_s")}


if __name__ == "__main__":
    main()
