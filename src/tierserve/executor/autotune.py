"""Choose each step size's code path by measuring it on this machine, once, and cache the choice.

A kernel tuned on one CPU was 1.5x slower than the library path on the next (an Intel Xeon
where MKL runs its AVX-512 code, against the AMD EPYC where the kernels were written), so
nothing is assumed: at first start the executor times a real forward pass of the loaded model
through every path of `model/plan.py` that applies (``bf16`` only where the CPU has AMX tiles:
the model then holds bfloat16 copies of its layers' weights while measuring, and keeps them
only if the plan uses the path), at a few step sizes, in its own KV cache
(before any request holds a block), and keeps the fastest path per size:

* decode-shaped steps of 1, 4, 16 and 64 requests (one new token each, 128 tokens of context);
* prompt-shaped steps of 128, 256 and 512 rows (one fresh chunk; 256 since the bf16 path,
  which crosses the fused layer between 128 and 512 rows on AMX CPUs);

candidates interleaved, each first run once untimed at that size (a path's first call at a
new size pays for its scratch buffers: timed cold, the fused layer once measured 24 ms against
12 warm at 4 rows and lost every decode size from 3 rows up to a path 1.6x slower), then best
of five (three for prompts). A candidate more than 8x slower than the best in the untimed
round, or 1.5x after the first timed round, is not timed again, and one more than 4x slower at
a size is not warmed up at the next (timed cold once) (the BLAS paths dequantize
every weight per call: 0.25-2 s a step here). The plan is cached in
``$TIERSERVE_CACHE_DIR/autotune/<key>.json``, the key hashing the CPU model and instruction sets,
the thread count, torch's version, the kernels' build and the model's shapes and weight formats;
a later start with the same key reads it (~0 s) and logs the choice. ``TIERSERVE_AUTOTUNE=off``
keeps the default plan (the kernels wherever they apply); ``=again`` measures even if cached.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import torch

from tierserve.host.machine import describe, machine_fingerprint
from tierserve.host.paths import cache_dir
from tierserve.model.plan import NEVER, StepPlan
from tierserve.sampling_params import SamplingParams

log = logging.getLogger(__name__)

DECODE_SIZES = (1, 4, 16, 64)
PROMPT_SIZES = (128, 256, 512)
CONTEXT = 128


def threads(executor) -> int:
    """The threads a step runs on: the kernels' pool where the model has the kernels."""
    k = executor.model.kernels
    return k.kernel_threads() if k is not None else torch.get_num_threads()


def plan_key(executor) -> str:
    m = executor.model
    build = ""
    if m.kernels is not None:
        from tierserve.kernels.build import build_key

        build = build_key()
    raw = json.dumps(
        [
            machine_fingerprint(threads(executor)),
            build,
            m.config.to_dict(),
            m.weights_summary,
            executor.block_size,
            str(m.dtype),
            str(m.kv_dtype),
            m.paths(executor.block_size),  # the candidates (bf16: AMX, products allowed)
            "v4",  # v2: kernels own threads, fused at every size; v3: warm-up; v4: bf16 path
        ],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha1(raw.encode()).hexdigest()[:16]


def load_or_measure(executor) -> StepPlan:
    """The executor's plan: cached, measured now, or the default (see the module docstring)."""
    default = executor.plan
    setting = os.environ.get("TIERSERVE_AUTOTUNE", "on").strip().lower()
    if setting == "off" or default.source == "no kernels":
        return default
    path = cache_dir() / "autotune" / f"{plan_key(executor)}.json"
    if setting != "again" and path.exists():
        try:
            data = json.loads(path.read_text())
            plan = StepPlan(tuple((int(a), str(b)) for a, b in data["table"]), str(path))
            log.info("step plan (cached, %s): %s", path, plan.describe())
            return plan
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("ignoring the unreadable step-plan cache %s: %s", path, e)
    t0 = time.perf_counter()
    timings = measure(executor)
    if not timings:
        return default
    plan = choose(timings)
    log.info(
        "step plan (measured in %.1f s on %s): %s",
        time.perf_counter() - t0,
        describe(machine_fingerprint(threads(executor))),
        plan.describe(),
    )
    for rows, t in sorted(timings.items()):
        log.info(
            "  %4d rows: %s", rows, ", ".join(f"{p} {1e3 * s:.1f} ms" for p, s in sorted(t.items()))
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(
            json.dumps({"table": plan.table, "timings": {str(k): v for k, v in timings.items()}})
        )
        tmp.replace(path)
    except OSError as e:
        log.warning("could not cache the step plan in %s: %s", path, e)
    return plan


def choose(timings: dict[int, dict[str, float]]) -> StepPlan:
    """The fastest path per measured size; each size decides up to the next measured one."""
    sizes = sorted(timings)
    table: list[tuple[int, str]] = []
    for i, rows in enumerate(sizes):
        best = min(timings[rows], key=timings[rows].get)
        limit = NEVER if i == len(sizes) - 1 else (rows + sizes[i + 1]) // 2
        if table and table[-1][1] == best:
            table[-1] = (limit, best)
        else:
            table.append((limit, best))
    return StepPlan(tuple(table), "measured")


def measure(executor, clock=time.perf_counter) -> dict[int, dict[str, float]]:
    """Seconds per forward pass (by `clock`), by step rows and path, in the executor's own KV
    cache."""
    bs = executor.block_size
    ctx_blocks = -(-(CONTEXT + 1) // bs)
    need = max(max(DECODE_SIZES) * ctx_blocks, -(-max(PROMPT_SIZES) // bs))
    if executor.num_blocks < need or executor.states:
        log.info("step plan: default (a KV cache of %d blocks is too small to measure in)", need)
        return {}
    sp = SamplingParams(max_tokens=1)
    vocab = min(1000, executor.model.config.vocab_size - 1)
    paths = executor.model.paths(bs)
    timings: dict[int, dict[str, float]] = {}
    from tierserve.executor.state import RequestState

    hopeless: set[str] = set()  # more than 4x the best at the previous size
    for rows in DECODE_SIZES + PROMPT_SIZES:
        decode = rows in DECODE_SIZES
        cands = list(paths)
        best = dict.fromkeys(cands, float("inf"))
        cold = dict.fromkeys(cands, float("inf"))
        for rep in range(-1, 5 if decode else 3):
            # Round -1 warms the candidates up, untimed (its times prune those more than 8x
            # the best); one hopeless at the previous size skips it and is timed cold once,
            # as every candidate was before. After the first timed round only those within
            # 1.5x of the best go on.
            lead, cold_lead = min(best.values()), min(cold.values())
            for p in [
                c
                for c in cands
                if (rep < 0 and c not in hopeless)
                or (rep == 0 and (c in hopeless or cold[c] <= 8 * cold_lead))
                or (rep > 0 and best[c] <= 1.5 * lead)
            ]:
                states, sched = {}, {}
                if decode:
                    for r in range(rows):
                        blocks = list(range(r * ctx_blocks, (r + 1) * ctx_blocks))
                        toks = [1 + (r + i) % vocab for i in range(CONTEXT + 1)]
                        states[f"t{r}"] = RequestState(toks, CONTEXT, blocks, CONTEXT, sp)
                        sched[f"t{r}"] = 1
                else:
                    blocks = list(range(-(-rows // bs)))
                    toks = [1 + i % vocab for i in range(rows)]
                    states["t0"] = RequestState(toks, rows, blocks, 0, sp)
                    sched["t0"] = rows
                for rid, st in states.items():
                    executor.add_state(rid, st)
                t0 = clock()
                executor.forward(states, sched, path=p)
                took = clock() - t0
                if rep < 0:
                    cold[p] = took
                else:
                    best[p] = min(best[p], took)
                for rid in states:
                    executor.drop_state(rid)
        lead, cold_lead = min(best.values()), min(cold.values())
        hopeless = {c for c in cands if best[c] > 4 * lead and not cold[c] <= 8 * cold_lead}
        timings[rows] = {c: t for c, t in best.items() if t < float("inf")}
    return timings
