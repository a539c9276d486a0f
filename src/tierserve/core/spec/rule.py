"""Who speculates, and how far: a pure function of plain numbers, called by the scheduler and by
the simulator.

With acceptance rate `a` per draft token (each draft accepted only if all before it were), k
drafts yield ``E(k) = (1 - a^(k+1)) / (1 - a)`` tokens per step instead of 1 (SmartSpec's
expected accepted length, counting the token the verification samples anyway). The drafts
lengthen the shared step from `T` to `T + d(k)`, which every request in it pays. The rule
(SmartSpec's goodput rule, applied to the whole batch): pick the k that maximises the step's
tokens per second, ``(B - 1 + E(k)) / (T + d(k))`` over B decodes, and draft only if it beats
``B / T``. A memory-bound step (small batch, GEMMs that stream weights) has d(k) small, so
speculation pays; a compute-bound step (large batch) has d(k) ~ k / B of T, so it stops.
"""

from __future__ import annotations

from collections.abc import Callable


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens one verification step yields with k drafts at per-draft acceptance `acceptance`."""
    a = min(max(acceptance, 0.0), 0.999)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def pick_draft_len(
    acceptance: float,
    k_max: int,
    batch: int,
    step_s: float,
    extra_s: Callable[[int], float],
    min_gain: float = 1.0,
) -> int:
    """The number of drafts (0..k_max) that maximises the step's expected tokens per second.
    `batch`: decodes in the step (this request included); `step_s`: the step's predicted time
    without drafts; `extra_s(k)`: what k drafts add to it. 0 unless the best k beats no drafts
    by the factor `min_gain`."""
    if k_max <= 0 or step_s <= 0 or batch <= 0:
        return 0
    base = batch / step_s
    best_k, best = 0, base * min_gain
    for k in range(1, k_max + 1):
        rate = (batch - 1 + expected_tokens(acceptance, k)) / (step_s + max(0.0, extra_s(k)))
        if rate > best:
            best_k, best = k, rate
    return best_k
