"""Preemption as the scheduler does it: how many blocks a request is short of, victims chosen
by the policy in the KV manager's reclaim order, each victim swapped out or dropped for
recompute by cost (preemption.py), and swapped victims brought back. Mixed into
``Scheduler``; it happens in ``schedule()``, between steps: a victim already planned in this
step is taken out of the plan first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tierserve.core.kv.manager import NO_HITS, ComputedBlocks
from tierserve.core.preemption import PreemptionMode, choose_mode
from tierserve.core.stats import Preemption
from tierserve.core.step_state import StepPlan
from tierserve.policies import VictimCandidate
from tierserve.priority import NUM_PRIORITIES
from tierserve.request import Request, RequestStatus

if TYPE_CHECKING:
    from tierserve.config import SchedulerConfig
    from tierserve.core.kv import KVCacheManager
    from tierserve.core.preemption import PreemptionCosts, PreemptionCounts
    from tierserve.core.projection import Projection
    from tierserve.policies import Policy

S = RequestStatus


class Preempting:
    config: SchedulerConfig
    kv: KVCacheManager
    policy: Policy
    costs: PreemptionCosts | None
    running: dict[str, Request]
    swapped: dict[str, Request]
    preemptions: PreemptionCounts
    step_preemptions: list[Preemption]
    seats_freed: int

    def _enqueue(self, request: Request, requeue: bool) -> None: ...

    if TYPE_CHECKING:  # from Scheduler and Predictive (stubs here would shadow them)

        def _seats(self) -> int: ...
        def _reservations(self) -> Projection | None: ...
        def _reservation_fits(
            self, request: Request, computed: ComputedBlocks, projection: Projection | None
        ) -> bool: ...
        def _reserved(self, request: Request, projection: Projection | None) -> None: ...

    def _swap_in(self, plan: StepPlan) -> int | None:
        """Swap requests back in, in rank order. Returns the class of a swapped request the
        reservation holds back (None if none): nobody ranked after it is swapped in, and
        ``_admit_waiting`` admits no waiting request of its class (class-blind: none at all)."""
        if not self.swapped:
            return None
        waiting = self.policy.waiting_by_class()
        top_waiting = next((c for c in range(NUM_PRIORITIES) if waiting[c]), NUM_PRIORITIES)
        if not self.policy.traits.class_aware:
            top_waiting = NUM_PRIORITIES  # nobody waiting outranks a swapped request
        projection = self._reservations()  # None unless predictive_reserve
        for req in sorted(self.swapped.values(), key=self.policy.traits.rank):
            if self._seats() <= 0 or plan.budget <= 0 or top_waiting < req.priority:
                break
            if not self._reservation_fits(req, NO_HITS, projection):
                # Swapped back in, it would be predicted to push a peer out again: it waits
                # for predicted room, keeping its place ahead of its class.
                return int(req.priority)
            mapping = self.kv.swap_in(req)
            if mapping is None:
                break
            del self.swapped[req.request_id]
            req.transition(S.RUNNING)
            self.running[req.request_id] = req
            plan.swap_in(req, mapping)
            self.preemptions.swapped_in_blocks += len(mapping)
            self._reserved(req, projection)
        return None

    def _shortfall(self, req: Request, n: int, computed: ComputedBlocks) -> int:
        """Blocks `req` needs beyond what its class can be given right now."""
        need = self.kv.blocks_needed(req, n, computed)
        revived = sum(1 for b in computed.blocks if b.ref_cnt == 0)
        return max(0, need + revived - self.kv.headroom(req.priority))

    def _make_room(self, req: Request, blocks: int, plan: StepPlan, seat: bool = False) -> bool:
        """Preempt running requests so `req` gains `blocks` blocks of headroom (and a seat, if
        `seat`). Victims come from the policy, in the KV manager's reclaim order. Returns
        whether any were preempted."""
        if blocks <= 0 and not seat:
            return False
        may = self.policy.may_preempt
        others = [rid for rid, r in self.running.items() if r is not req and may(req, r)]
        if not others:
            return False
        order = self.kv.reclaim_order(req.priority, others)
        cands = [VictimCandidate(self.running[v.request_id], v.useful_blocks) for v in order]
        victims = self.policy.select_victims(cands, req, max(0, blocks))
        for v in victims:
            self._preempt(v, plan, for_request=req)
        return bool(victims)

    def _preempt(self, victim: Request, plan: StepPlan, for_request: Request | None = None) -> None:
        """Preempt `victim` (swap or recompute, by cost) to make room for `for_request`, or
        because it could not grow itself (None)."""
        rid = victim.request_id
        plan.unschedule(victim)
        blocks = len(self.kv.block_ids(rid))
        mode = choose_mode(
            self.config.preemption_mode,
            self.costs,
            blocks,
            victim.num_computed_tokens,
            self.config.swap_cost_ratio,
        )
        mapping = self.kv.swap_out(victim) if mode == PreemptionMode.SWAP else None
        del self.running[rid]
        self.seats_freed += 1
        victim.num_preemptions += 1
        counts = self.preemptions
        counts.by_victim_class[victim.priority] += 1
        cause = victim if for_request is None else for_request
        counts.by_cause[cause.priority][victim.priority] += 1
        counts.self_preempted += for_request is None
        counts.for_admission += for_request is not None and for_request.request_id not in (
            self.running
        )
        counts.victims += victim.num_preemptions == 1
        swap = PreemptionMode.SWAP if mapping is not None else PreemptionMode.RECOMPUTE
        self.step_preemptions.append(Preemption(victim.base_priority, swap))
        if mapping is not None:
            victim.transition(S.SWAPPED)
            self.swapped[rid] = victim
            plan.swap_out(victim, mapping)
            self.preemptions.swap += 1
            self.preemptions.swapped_out_blocks += len(mapping)
        else:
            self.kv.free(rid)
            victim.num_computed_tokens = 0
            victim.transition(S.PREEMPTED)
            self._enqueue(victim, requeue=True)
            plan.preempt_recompute(victim)
            self.preemptions.recompute += 1
