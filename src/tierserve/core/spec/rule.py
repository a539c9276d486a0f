"""Who speculates, and how far: a pure function of plain numbers, called by the scheduler and by
the simulator.

With acceptance rate `a` per draft token (each draft accepted only if all before it were), k
drafts yield ``E(k) = (1 - a^(k+1)) / (1 - a)`` tokens per step instead of 1 (SmartSpec's
expected accepted length, counting the token the verification samples anyway). The drafts
lengthen the shared step from `T` to `T + d(k)`, which every request in it pays. The rule
(SmartSpec's goodput rule, applied to the whole step): pick the k that maximises the step's
tokens per second, ``(W - 1 + E(k)) / (T + d(k))`` where W counts every token the step yields
without drafts (decodes and prefill chunk tokens alike: a prompt's progress is work done too),
and draft only if it beats ``W / T``. A memory-bound step (a few decodes, GEMMs that stream
weights) has d(k) small, so speculation pays; a compute-bound step (a large batch, or a long
prefill chunk) has d(k) ~ k / W of T, so it stops.
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
    tokens: int,
    step_s: float,
    extra_s: Callable[[int], float],
    min_gain: float = 1.0,
) -> int:
    """The number of drafts (0..k_max) that maximises the step's expected tokens per second.
    `tokens`: what the step yields without drafts (this request's token included); `step_s`:
    its predicted time without them; `extra_s(k)`: what k drafts add to it. 0 unless the best
    k beats no drafts by the factor `min_gain`."""
    if k_max <= 0 or step_s <= 0 or tokens <= 0:
        return 0
    base = tokens / step_s
    best_k, best = 0, base * min_gain
    for k in range(1, k_max + 1):
        rate = (tokens - 1 + expected_tokens(acceptance, k)) / (step_s + max(0.0, extra_s(k)))
        if rate > best:
            best_k, best = k, rate
    return best_k
