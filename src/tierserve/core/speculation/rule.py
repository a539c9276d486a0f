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

For P0 (`latency_classes`) the rule trades a little of the step's rate for the request's own
time per token: the k that maximises P0's own tokens per second, ``E(k) / (T + d(k))``, among
those that keep the step's rate at least `throughput_floor` (0.97) of its rate without drafts.
A P0 beside a flood of background decodes thus drafts when its drafts cost the others at most
3%; the rate floor is shared by every P0 drafting in the step.
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
    floor: float = 1.0,
    base_rate: float | None = None,
) -> int:
    """How many drafts (0..k_max) to verify. `tokens`: what the step yields without them (this
    request's token included); `step_s`: its predicted time without them; `extra_s(k)`: what k
    drafts add to it.

    Throughput (`floor` >= 1): the k that maximises the step's expected tokens per second, 0
    unless it beats no drafts. Latency (`floor` < 1, for P0): the k that maximises this
    request's own tokens per second, among those that keep the step's rate at least `floor` x
    `base_rate` (default: this step's rate without drafts; pass the rate before any request's
    drafts so that several requests' drafts share one allowance)."""
    if k_max <= 0 or step_s <= 0 or tokens <= 0:
        return 0
    base = tokens / step_s
    allowed = floor * (base_rate if base_rate is not None else base)
    best_k, best_rate, best_own = 0, base, 1.0 / step_s
    for k in range(1, k_max + 1):
        t = step_s + max(0.0, extra_s(k))
        e = expected_tokens(acceptance, k)
        rate, own = (tokens - 1 + e) / t, e / t
        if floor >= 1.0:
            if rate > best_rate:
                best_k, best_rate = k, rate
        elif rate >= allowed and own > best_own:
            best_k, best_own = k, own
    return best_k
