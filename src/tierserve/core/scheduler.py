"""The scheduler: joins the policy (waiting queue, victims) and the KV cache manager.

There are no prefill and decode phases: every request has ``num_computed_tokens`` catching up to
``num_tokens``. A step's token budget is shared by whoever needs tokens, so prefill chunks and
decode tokens mix in one batch. Each ``schedule()``, in this order:

1. bring swapped requests back, most urgent first, while memory and seats allow and no more
   urgent request is waiting;
2. keep running requests going, most urgent first; a request that cannot get its next block
   preempts running requests ranked below it (victims chosen by the policy in the KV manager's
   reclaim order) or, if there are none, is preempted itself;
3. admit waiting requests in the policy's order; one that finds no seat or no memory preempts
   running requests of strictly lower classes (policy permitting), else admission stops.

Preemption happens here, between steps, never during one: a victim already scheduled in this
step is unscheduled before its output is built, so no launched step is touched. A victim is
swapped out or dropped for recompute by cost (see preemption.py); either way it keeps its place
at the head of its class.
"""

from __future__ import annotations

import itertools

from tierserve.clock import Clock
from tierserve.config import SchedulerConfig
from tierserve.core.invariants import check_scheduler
from tierserve.core.kv import KVCacheManager
from tierserve.core.kv.manager import NO_HITS, ComputedBlocks
from tierserve.core.limits import RequestLimits
from tierserve.core.outputs import ExecutorOutput, SchedulerOutput
from tierserve.core.preemption import PreemptionCosts, PreemptionCounts, PreemptionMode, choose_mode
from tierserve.core.stats import Preemption, SchedulerStats, scheduler_stats
from tierserve.core.step_state import StepPlan
from tierserve.core.stopping import take_output
from tierserve.policies import Policy, SchedulerState, VictimCandidate
from tierserve.policies.base import arrival_key
from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.request import FinishReason, Request, RequestStatus

S = RequestStatus


class Scheduler:
    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        policy: Policy,
        clock: Clock,
        costs: PreemptionCosts | None = None,
    ) -> None:
        self.config = config
        self.kv = kv
        self.policy = policy
        self.clock = clock
        self.costs = costs
        self.requests: dict[str, Request] = {}
        self.running: dict[str, Request] = {}
        self.swapped: dict[str, Request] = {}
        self._seq = itertools.count()
        self._step = 0
        self._forget: set[str] = set()  # leave the executor's state at the next step
        self._known: set[str] = set()  # requests whose state the executor holds
        self._waiting_count = [0] * NUM_PRIORITIES  # by submitted class
        self._waiting_tokens = [0] * NUM_PRIORITIES
        self.preemptions = PreemptionCounts()
        self.limits = RequestLimits(
            config.max_model_len, kv.block_size, tuple(kv.ledger.capacity(p) for p in Priority)
        )
        # Left the queue for the running batch since the start, by submitted class (requests,
        # prompt tokens): admission control measures drain rates from these.
        self.served = [0] * NUM_PRIORITIES
        self.served_tokens = [0] * NUM_PRIORITIES
        policy.can_hold = self.limits.fits
        self.step_preemptions: list[Preemption] = []  # in the last schedule()
        self._changed: list[Request] = []  # finished inside schedule(), reported with the step
        self._last_express = -(10**9)
        self.express_steps = 0

    # -- intake ----------------------------------------------------------------------------
    def validate(self, request: Request) -> None:
        """Raise ValueError (naming the numbers) if `request` can never be served here."""
        self.limits.check(request)

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the engine")
        if request.status != S.WAITING:
            raise ValueError(f"request {request.request_id} is {request.status.value}, not new")
        self.validate(request)
        request.arrival_seq = next(self._seq)
        self.requests[request.request_id] = request
        self._enqueue(request, requeue=False)

    def _enqueue(self, request: Request, requeue: bool) -> None:
        (self.policy.requeue_preempted if requeue else self.policy.add)(request)
        self._waiting_count[request.base_priority] += 1
        self._waiting_tokens[request.base_priority] += request.num_tokens

    def _dequeued(self, request: Request) -> None:
        self._waiting_count[request.base_priority] -= 1
        self._waiting_tokens[request.base_priority] -= request.num_tokens

    # -- the step --------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        now = self.clock.now()
        self.kv.observe(now)
        if self.policy.traits.class_aware:
            self.kv.set_p1_waiting(self.policy.waiting_by_class()[Priority.P1] > 0)
        plan = StepPlan(self._step, self.config.max_num_batched_tokens)
        self._step += 1
        self.step_preemptions = []
        plan.out.finished_req_ids = self._forget
        self._forget = set()
        express = self._express_step()
        if not express:
            self._swap_in(plan)
        self._schedule_running(plan, express)
        self._admit_waiting(plan, now, only_p0=bool(express))
        # Requests ended inside this schedule() (alone and out of memory) are forgotten by the
        # executor in this same step; update_from_output reports them.
        plan.out.finished_req_ids |= self._forget
        self._forget = set()
        out = plan.build(self.running, self.kv, self._known)
        if self.config.check_invariants:
            self.check_invariants(out)
        return out

    def _seats(self) -> int:
        return self.config.max_num_seqs - len(self.running)

    def _tokens_for(self, req: Request, budget: int, already: int = 0) -> int:
        remaining = req.num_tokens - req.num_computed_tokens - already
        cap = budget
        if req.num_prompt_tokens > self.config.long_prefill_threshold and not (
            self.policy.traits.prefill_cap_exempt(req)
        ):
            cap = min(cap, self.config.long_prefill_max_tokens)
        return max(0, min(remaining, cap))

    def _swap_in(self, plan: StepPlan) -> None:
        if not self.swapped:
            return
        waiting = self.policy.waiting_by_class()
        top_waiting = next((c for c in range(NUM_PRIORITIES) if waiting[c]), NUM_PRIORITIES)
        if not self.policy.traits.class_aware:
            top_waiting = NUM_PRIORITIES  # nobody waiting outranks a swapped request
        for req in sorted(self.swapped.values(), key=self.policy.traits.rank):
            if self._seats() <= 0 or plan.budget <= 0 or top_waiting < req.priority:
                break
            mapping = self.kv.swap_in(req)
            if mapping is None:
                break
            del self.swapped[req.request_id]
            req.transition(S.RUNNING)
            self.running[req.request_id] = req
            plan.swap_in(req, mapping)
            self.preemptions.swapped_in_blocks += len(mapping)

    def _express_step(self) -> str | None:
        """A P0 request is waiting: build the next step for it (see SchedulerConfig.p0_express),
        so its first token does not wait behind other classes' work. Rate-limited so the others
        cannot starve. Returns the express mode, or None for a normal step."""
        cfg = self.config
        if cfg.p0_express == "off" or not self.policy.traits.p0_strict:
            return None
        if self._waiting_count[Priority.P0] == 0:
            return None
        if self._step - self._last_express <= cfg.p0_express_min_gap:
            return None
        self._last_express = self._step
        self.express_steps += 1
        return cfg.p0_express

    def _schedule_running(self, plan: StepPlan, express: str | None = None) -> None:
        # A running request's prefill chunk leaves budget for the tokens waiting in classes the
        # policy serves strictly before it (P0 under hybrid; every more urgent class under
        # strict), so such a request is not stuck behind a long lower-class prompt admitted
        # earlier. Decodes (one token) are never held back, so a chunk also leaves room for the
        # decodes ranked after it.
        ahead = self._strict_ahead()
        ranked = sorted(self.running.values(), key=self.policy.traits.rank)
        decodes_left = sum(1 for r in ranked if r.num_tokens - r.num_computed_tokens == 1)
        for req in ranked:
            decodes_left -= req.num_tokens - req.num_computed_tokens == 1
            if req.request_id not in self.running or plan.budget <= 0:
                continue
            lower = req.priority != Priority.P0
            if express == "exclusive" and lower:
                break  # ranked by class: everyone after this is lower
            n = self._tokens_for(req, plan.budget)
            if express == "decode" and lower and n > 1:
                continue  # lower classes decode, their prefill chunks wait for a normal step
            if n > 1 and ahead[req.priority]:
                n = min(n, max(1, plan.budget - ahead[req.priority] - decodes_left))
            if n == 0:
                continue
            while req.request_id in self.running:
                ids = self.kv.allocate_slots(req, n)
                if ids is not None:
                    plan.schedule(req, n, ids)
                    break
                grow = self.limits.fits(req) and req.num_computed_tokens + n <= (
                    self.limits.capacity[req.priority] * self.kv.block_size
                )
                if grow and self._make_room(req, self._shortfall(req, n, NO_HITS), plan):
                    continue
                if not grow or len(self.running) == 1:
                    # At its class's capacity, or alone and still no room: it has all the KV
                    # memory it can ever get. (Requeued, it would block its class's head.)
                    plan.unschedule(req)
                    self.finish(req.request_id, S.FINISHED, "length")
                    self._changed.append(req)
                else:
                    self._preempt(req, plan)

    def _strict_ahead(self) -> list[int]:
        """Tokens waiting, per class, in the classes the policy serves strictly before it."""
        strict = self.policy.traits.strict_before
        ahead = [0] * NUM_PRIORITIES
        for c in range(NUM_PRIORITIES):
            ahead[c] = sum(self._waiting_tokens[k] for k in strict[c])
        return ahead

    def _admit_waiting(self, plan: StepPlan, now: float, only_p0: bool = False) -> None:
        while plan.budget > 0:
            req = self.policy.peek(self._state(now))
            if req is None or (only_p0 and req.priority != Priority.P0):
                break
            computed = self.kv.get_computed_blocks(req)
            n = self._tokens_for(req, plan.budget, computed.num_tokens)
            ids = self.kv.allocate_slots(req, n, computed) if self._seats() > 0 else None
            if ids is None:
                short = self._shortfall(req, n, computed)
                if self._make_room(req, short, plan, seat=self._seats() <= 0):
                    ids = self.kv.allocate_slots(req, n, computed)
            if ids is None or self._seats() <= 0:
                if ids is not None:  # memory came, the seat did not
                    self.kv.free(req.request_id)
                break  # head-of-line: the next request waits for this one
            self.policy.commit(req)
            self._dequeued(req)
            req.num_computed_tokens = computed.num_tokens
            req.transition(S.RUNNING)
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
            self.running[req.request_id] = req
            plan.schedule(req, n, ids)
            self.served[req.base_priority] += 1
            self.served_tokens[req.base_priority] += req.num_prompt_tokens

    def _shortfall(self, req: Request, n: int, computed: ComputedBlocks) -> int:
        """Blocks `req` needs beyond what its class can be given right now."""
        need = self.kv.blocks_needed(req, n, computed)
        revived = sum(1 for b in computed.blocks if b.ref_cnt == 0)
        return max(0, need + revived - self.kv.headroom(req.priority))

    def _state(self, now: float) -> SchedulerState:
        by_class = [0] * NUM_PRIORITIES
        for r in self.running.values():
            by_class[r.priority] += 1
        return SchedulerState(
            now=now,
            idle_seats=self._seats(),
            running_by_class=tuple(by_class),
            headroom_by_class=tuple(self.kv.headroom(p) for p in Priority),
        )

    # -- preemption ------------------------------------------------------------------------
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
            self._preempt(v, plan)
        return bool(victims)

    def _preempt(self, victim: Request, plan: StepPlan) -> None:
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
        victim.num_preemptions += 1
        self.preemptions.by_victim_class[victim.priority] += 1
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

    # -- results ---------------------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, result: ExecutorOutput) -> list[Request]:
        """Advance computed tokens, append sampled tokens, apply stop conditions. Returns the
        requests that changed in this step (finished inside ``schedule()``, got a token,
        finished or failed), in scheduling order. Called after every ``schedule()``."""
        now = self.clock.now()
        failed = result.failed
        changed, self._changed = self._changed, []
        for rid, n in out.num_scheduled_tokens.items():
            req = self.running.get(rid)
            if req is None:
                continue  # aborted while the step ran
            if rid in failed:
                changed.append(self.finish(rid, S.FAILED, failed[rid]))
                continue
            req.num_computed_tokens += n
            self.kv.cache_blocks(req)
            got, reason = take_output(req, result, now, self.config.max_model_len)
            if reason is not None:
                self.finish(rid, S.FINISHED, reason)
            if got or reason is not None:
                changed.append(req)
        return changed

    def finish(self, request_id: str, status: RequestStatus, reason: str | None = None) -> Request:
        """End a request from any live state (finished, aborted or failed), freeing its KV."""
        req = self.requests.pop(request_id, None)
        if req is None:
            raise KeyError(f"unknown request {request_id!r}")
        if request_id in self.running:
            del self.running[request_id]
            self._forget.add(request_id)
        elif request_id in self.swapped:
            del self.swapped[request_id]
        elif self.policy.remove(req):
            self._dequeued(req)
        if self.kv.holds(request_id) or self.kv.is_swapped(request_id):
            self.kv.free(request_id)
        req.transition(status)
        req.finished_time = self.clock.now()
        if status == S.FINISHED:
            req.finish_reason = FinishReason(reason or "stop")
        else:
            req.finish_reason = FinishReason.ABORT if status == S.ABORTED else FinishReason.ERROR
            req.error = reason
        return req

    # -- queue view (for admission control) --------------------------------------------------
    def queue_depth(self, priority: Priority) -> int:
        return self._waiting_count[priority]

    def queued_tokens(self, priority: Priority) -> int:
        return self._waiting_tokens[priority]

    def dequeued(self, priority: Priority) -> tuple[int, int]:
        return self.served[priority], self.served_tokens[priority]

    def can_shed(self, below: Priority) -> bool:
        return any(self._waiting_count[c] for c in range(int(below) + 1, NUM_PRIORITIES))

    def lowest_waiting(self, below: Priority) -> str | None:
        """The waiting request to shed first among classes less urgent than `below`: the
        latest arrival of the least urgent class. O(waiting); called only when shedding."""
        cands = [r for r in self.policy.requests() if r.base_priority > below]
        if not cands:
            return None
        return max(cands, key=lambda r: (r.base_priority, *arrival_key(r))).request_id

    @property
    def num_waiting(self) -> int:
        return len(self.policy)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def make_stats(self, with_queue: bool = False) -> SchedulerStats:
        """The state as one frozen record (core/stats.py); `with_queue`: the predictor's view."""
        return scheduler_stats(self, with_queue)

    # -- invariants ---------------------------------------------------------------------------
    def check_invariants(self, out: SchedulerOutput | None = None) -> None:
        check_scheduler(self, out)
