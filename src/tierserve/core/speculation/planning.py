"""Drafts planned into a step the scheduler has otherwise finished: only the decodes already in
it, only within the token budget left, never at the cost of anyone's seat or memory (a draft
that needs a block the pool cannot give is dropped), and not in a P0 express step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tierserve.core.speculation.rule import expected_tokens, pick_draft_len
from tierserve.core.step_state import draft_work

if TYPE_CHECKING:
    from tierserve.core.scheduler import Scheduler
    from tierserve.core.step_state import StepPlan
    from tierserve.request import Request


def may_speculate(req: Request, alone: bool, classes: tuple[int, ...]) -> bool:
    """A request's own settings allow it (no penalties, grammar or opt-out: their per-token
    state is not drafted), and its class does, or it runs alone. The class is the one it was
    submitted with: aging promotes a request that waited (a P3 stream of a flood runs as P1
    once admitted) so that it is admitted, not so that it drafts like the class it reached."""
    sp = req.sampling_params
    if not sp.speculative or sp.uses_penalties or sp.grammar is not None:
        return False
    return req.base_priority in classes or alone


def plan_drafts(s: Scheduler, plan: StepPlan) -> None:
    spec = s.speculation
    if spec is None or plan.budget <= 0:
        return
    decodes = [
        r
        for r in s.running.values()
        if plan.tokens.get(r.request_id) == 1 and r.num_tokens - r.num_computed_tokens == 1
    ]
    if not decodes:
        return
    coef = s.step_time.coefficients
    work = plan.total_work()
    step_s, tokens = coef.seconds(work), work.tokens
    base_rate = tokens / step_s if step_s > 0 else None  # before anyone's drafts
    alone = len(s.running) == 1 and len(s.policy) == 0 and not s.swapped
    cfg = spec.config
    # A draft model proposes k drafts in k passes shared by the step's drafting requests: a
    # request drafting more than anyone before it pays the passes the others did not.
    pass_s, passes = spec.draft_pass_s(), 0
    for req in sorted(decodes, key=s.policy.traits.rank):
        if plan.budget <= 0:
            break
        if not may_speculate(req, alone, cfg.classes):
            continue
        sp = req.sampling_params
        room = min(
            cfg.num_speculative_tokens,
            plan.budget,
            sp.max_tokens - req.num_output_tokens - 1,  # the verified token comes on top
            s.config.max_model_len - req.num_tokens - 1,
        )
        if room <= 0:
            continue
        ctx = req.num_tokens

        def extra(k: int, ctx=ctx, paid=passes) -> float:
            verify = coef.seconds(draft_work(ctx, k), with_overhead=False)
            return verify + max(0, k - paid) * pass_s

        # The rule first (plain arithmetic), the drafter only where drafts could pay: a large
        # batch never pays for a lookup per request.
        alpha = spec.acceptance_of(req)
        floor = cfg.throughput_floor if req.base_priority in cfg.latency_classes else 1.0

        k = pick_draft_len(alpha, room, tokens, step_s, extra, floor, base_rate)
        if k == 0:
            continue
        drafts = spec.drafter(req.all_token_ids, k)[:k]
        if len(drafts) < k:  # fewer found: still worth it?
            k = pick_draft_len(alpha, len(drafts), tokens, step_s, extra, floor, base_rate)
            if k == 0:
                continue
        ids = s.kv.allocate_slots(req, 1 + k)
        if ids is None:
            continue
        plan.speculate(req, drafts[:k], ids)
        step_s += extra(k)
        passes = max(passes, k)
        tokens += expected_tokens(alpha, k) - 1  # what its drafts are expected to yield
