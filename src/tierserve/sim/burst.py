"""Issue 46's burst probe in the simulator: `n` requests of one class (or a shuffled mix) sent
at the same moment to the CPU engine's step times (sim/promise.py's `CPU`), SLA admission on or
off. Reports how many were admitted and how many of those had their first token within the
class's SLA. Deterministic: the tests assert on it and
`benchmarks/simulation/sla_burst_sim.py` prints it.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

from tierserve.config import PriorityConfig
from tierserve.priority import Priority
from tierserve.sim.engine.runner import run_simulation
from tierserve.sim.promise import CPU, CPU_LENGTHS
from tierserve.sim.scenarios import with_sla_admission
from tierserve.workloads.synthetic import Workload, WorkloadConfig

GAP_S = 1e-4  # between two requests of the burst: "at once", in arrival order


class Burst(Workload):
    """`counts[c]` requests of class c, shuffled, all within a millisecond, then nothing."""

    def __init__(self, cfg: WorkloadConfig, counts: tuple[int, ...]) -> None:
        super().__init__(cfg)
        order = [Priority(c) for c, n in enumerate(counts) for _ in range(n)]
        random.Random(cfg.seed).shuffle(order)
        self._order, self._i = order, 0

    def _class(self) -> Priority:  # the class of the next request made: the burst's own
        prio = self._order[self._i]
        self._i += 1
        return prio

    def gap(self) -> float:
        return GAP_S if self._i < len(self._order) else math.inf


def burst(counts: tuple[int, ...], sla_admission: bool, seed: int = 0) -> dict:
    """Run the burst; per class: sent, admitted, on time (first token within its SLA)."""
    cfg = replace(
        CPU,
        num_kv_blocks=4000,  # as sim/promise.py's overload: room for a 300-request burst
        max_retries=0,
        workload=WorkloadConfig(
            mix=tuple(1 if n else 0 for n in counts),
            classes=CPU_LENGTHS,
            arrival="poisson",
            rate=1.0,
            duration_s=60.0,
            warmup_s=0.0,
            seed=seed,
            vocab_size=49152,
        ),
    )
    if sla_admission:
        cfg = with_sla_admission(cfg)
    r = run_simulation(cfg, keep_records=True, workload=Burst(cfg.workload, counts))
    slas = PriorityConfig()
    out = {}
    for c, n in enumerate(counts):
        if not n:
            continue
        p = Priority(c)
        recs = [x for x in r["records"] if x.priority == p]
        admitted = [x for x in recs if x.first_token is not None]
        sla = slas.sla(p)
        ok = [x for x in admitted if sla is None or x.first_token - x.arrival <= sla]
        ttfts = sorted(x.first_token - x.arrival for x in admitted)
        out[p.label] = {
            "sent": len(recs),
            "admitted": len(admitted),
            "on_time": len(ok),
            "worst_ttft_s": ttfts[-1] if ttfts else None,
        }
    return out
