"""The scheduler: joins the policy (waiting queue, victims) and the KV cache manager.

There are no prefill and decode phases: every request has ``num_computed_tokens`` catching up to
``num_tokens``. A step's token budget is shared by whoever needs tokens, so prefill chunks and
decode tokens mix in one batch. Each ``schedule()``, in this order:

1. bring swapped requests back, most urgent first, while memory and seats allow and no more
   urgent request is waiting (with ``predictive_reserve``, while the reservation's check
   passes: a held swapped request also holds back its class's waiting requests);
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
from tierserve.core.calm import CalmSteps
from tierserve.core.cut_in import CutIn
from tierserve.core.invariants import check_scheduler
from tierserve.core.kv import KVCacheManager
from tierserve.core.kv.manager import NO_HITS
from tierserve.core.limits import RequestLimits
from tierserve.core.outputs import ExecutorOutput, SchedulerOutput
from tierserve.core.predict import LengthPredictor
from tierserve.core.predictive import Predictive
from tierserve.core.preemption import PreemptionCosts, PreemptionCounts
from tierserve.core.queue_counts import QueueCounts
from tierserve.core.speculation import Speculation
from tierserve.core.speculation.planning import plan_drafts
from tierserve.core.stats import Preemption, SchedulerStats, scheduler_stats
from tierserve.core.step_state import StepPlan, wants_prompt_logprobs
from tierserve.core.step_time import (
    EXPRESS_WINDOW_S,
    P0_WAIT_SHARE,
    ExpressShare,
    StepBounds,
    StepTimeModel,
    StepWork,
)
from tierserve.core.stopping import take_output
from tierserve.core.victims import Preempting
from tierserve.policies import Policy, SchedulerState
from tierserve.priority import NUM_PRIORITIES, Priority
from tierserve.request import FinishReason, Request, RequestStatus

S = RequestStatus


class Scheduler(QueueCounts, Preempting, Predictive, CutIn):
    def __init__(
        self,
        config: SchedulerConfig,
        kv: KVCacheManager,
        policy: Policy,
        clock: Clock,
        costs: PreemptionCosts | None = None,
        speculation: Speculation | None = None,
        predictor: LengthPredictor | None = None,
    ) -> None:
        self.config = config
        self.speculation = speculation  # None: no speculative decoding
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
        self._init_counts()
        self.preemptions = PreemptionCounts()
        self.limits = RequestLimits(
            config.max_model_len, kv.block_size, tuple(kv.ledger.capacity(p) for p in Priority)
        )
        policy.can_hold = self.limits.fits
        self.step_preemptions: list[Preemption] = []  # in the last schedule()
        self._changed: list[Request] = []  # finished inside schedule(), reported with the step
        self._express_time = ExpressShare(EXPRESS_WINDOW_S)
        self.express_steps = 0
        self.seats_freed = 0  # requests that left the running batch since the start
        # Prompt tokens of requests starting their prefill, and those of them found in the
        # prefix cache, since the start: the TTFT predictor's share of a prompt to compute.
        self.p0_prompt_in_flight = False  # the step planned last prefills a P0 prompt
        self.prompt_tokens_started = 0
        self.prompt_tokens_cached = 0
        # Step time, predicted and measured (step_time.py), and the bound on it.
        self.step_time = StepTimeModel(costs.prefill_tokens_per_s if costs else None)
        self._bounds = StepBounds(config, policy)
        self.step_bound_s = self._bounds.plain  # the bound of the step planned last
        p0_sla = policy.priorities.sla(Priority.P0) if policy.traits.p0_strict else None
        self.calm = CalmSteps(
            config.p0_calm_fraction, config.p0_recent_s, p0_sla, config.batch_calm_fraction
        )
        # (start, work, express?) of the step handed out, measured when its output comes back
        self._planned: tuple[float, StepWork, bool] | None = None
        self._init_cut_in()  # steps for P0 inside a step in flight (cut_in.py)
        self._init_predictive(predictor)  # output lengths, learned and used (predictive.py)

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
        self.calm.on_arrival(request, self.clock.now())
        self._predict(request)
        self._enqueue(request, requeue=False)

    # -- the step --------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        now = self.clock.now()
        self.kv.observe(now)
        if self.policy.traits.class_aware:
            self.kv.set_p1_waiting(self.policy.waiting_by_class()[Priority.P1] > 0)
        self.step_bound_s = self._bounds.at(now, self.calm.last_p0)
        plan = StepPlan(
            self._step,
            self.config.max_num_batched_tokens,
            self.step_time.coefficients,
            self.step_bound_s,
            self.kv.block_size,
        )
        self._step += 1
        self.step_preemptions = []
        plan.out.finished_req_ids = self._forget
        self._forget = set()
        self._repay_seats(plan)  # seats a cut-in took beyond max_num_seqs (cut_in.py)
        express = self._express_step(now)
        held = None if express else self._swap_in(plan)
        self._schedule_running(plan, express)
        self._admit_waiting(plan, now, only_p0=bool(express), held=held)
        if not express:
            plan_drafts(self, plan)
        # Requests ended inside this schedule() (alone and out of memory) are forgotten by the
        # executor in this same step; update_from_output reports them.
        plan.out.finished_req_ids |= self._forget
        self._forget = set()
        out = plan.build(self.running, self.kv, self._known)
        self._planned = (now, plan.total_work(), bool(express))
        # A P0 prompt in this step: no cut-in while it runs (core/cut_in.py)
        self.p0_prompt_in_flight = any(
            self.running[r].priority == Priority.P0 for r in plan.chunk_ids if r in self.running
        )
        if self.config.check_invariants:
            self.check_invariants(out)
        return out

    def planned_seconds(self) -> float | None:
        """The step-time model's prediction for the step just scheduled (None: none planned)."""
        if self._planned is None:
            return None
        return self.step_time.predict(self._planned[1])

    def _seats(self) -> int:
        return self.config.max_num_seqs - len(self.running)

    def _tokens_for(
        self, req: Request, plan: StepPlan, already: int = 0, cap: int | None = None, keep=0.0
    ) -> int:
        """Tokens `req` computes in this step (`already` of its tokens are prefix hits): what is
        left, within the token budget (and `cap`), the long-prefill cap, and the time the step
        may still take, keeping `keep` seconds for work that must still come in."""
        remaining = req.num_tokens - req.num_computed_tokens - already
        cap = plan.budget if cap is None else min(cap, plan.budget)
        long_cap = self.policy.traits.long_prefill_cap(req, self.config)
        if long_cap is not None:
            cap = min(cap, long_cap)
        n = max(0, min(remaining, cap))
        if remaining <= 1:
            return n  # a decode (counted in the time budget upfront)
        done = req.num_computed_tokens + already
        exempt = self.policy.traits.prefill_cap_exempt
        if exempt(req):
            # P0's own prompt is never cut (cut, its own first token would be late). But a
            # second one that would stretch the step past its time bound waits whole for the
            # next step: the first P0's first token does not wait for the other's prompt.
            others = any(exempt(self.running[r]) for r in plan.chunk_ids if r in self.running)
            if others and plan.time.fit(n, done, wants_prompt_logprobs(req), keep) < n:
                return 0
            return n
        return plan.time.fit(n, done, wants_prompt_logprobs(req), keep)

    def _express_step(self, now: float) -> str | None:
        """A P0 request is waiting: build the next step for it (see SchedulerConfig.p0_express),
        so its first token does not wait behind other classes' work. Rate-limited so the others
        cannot starve: express steps take at most 1 / (1 + `p0_express_min_gap`) of the
        engine's time over the last ~``EXPRESS_WINDOW_S`` (counted in time, not steps: a short
        express step between long ones must not make the next P0 wait through several of
        them). Returns the express mode, or None for a normal step."""
        cfg = self.config
        if cfg.p0_express == "off" or not self.policy.traits.p0_strict:
            return None
        if self._waiting_count[Priority.P0] == 0:
            return None
        if self._express_time.share(now) >= 1.0 / (1 + cfg.p0_express_min_gap):
            return None
        self.express_steps += 1
        return cfg.p0_express

    def _schedule_running(self, plan: StepPlan, express: str | None = None) -> None:
        # A running request's prefill chunk leaves budget for the tokens waiting in classes the
        # policy serves strictly before it (P0 under hybrid; every more urgent class under
        # strict), so such a request is not stuck behind a long lower-class prompt admitted
        # earlier. Decodes (one token) are never held back, so a chunk also leaves room (and
        # time: they are counted in the time budget first) for the decodes ranked after it.
        ahead = self._strict_ahead()
        ranked = sorted(self.running.values(), key=self.policy.traits.rank)
        decodes = [r for r in ranked if r.num_tokens - r.num_computed_tokens == 1]
        if express == "exclusive":
            decodes = [r for r in decodes if r.priority == Priority.P0]
        held = self.calm.hold(decodes, self.step_time.coefficients, self.clock.now())
        if held:
            decodes = [r for r in decodes if r.request_id not in held]
        plan.reserve_decodes(decodes)
        decodes_left = len(decodes)
        for req in ranked:
            decodes_left -= (
                req.num_tokens - req.num_computed_tokens == 1 and req.request_id not in held
            )
            if req.request_id not in self.running or plan.budget <= 0 or req.request_id in held:
                continue
            lower = req.priority != Priority.P0
            if express == "exclusive" and lower:
                break  # ranked by class: everyone after this is lower
            if express == "decode" and lower and req.num_tokens - req.num_computed_tokens > 1:
                continue  # lower classes decode, their prefill chunks wait for a normal step
            cap, keep = None, 0.0
            if ahead[req.priority]:  # leave budget and time for the waiting strict classes
                cap = max(1, plan.budget - ahead[req.priority] - decodes_left)
                keep = plan.time.cost(StepWork.chunk(ahead[req.priority], 0, 1))
                keep += P0_WAIT_SHARE * plan.time.bound
            n = self._tokens_for(req, plan, cap=cap, keep=keep)
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

    def _admit_waiting(
        self,
        plan: StepPlan,
        now: float,
        only_p0: bool = False,
        cut_in: bool = False,
        held: int | None = None,
    ) -> None:
        """Admit waiting requests in the policy's order while the step has room; `cut_in`: a
        step inside a step in flight (core/cut_in.py), which preempts nobody; `held`: the
        class of a swapped request the reservation holds back (``_swap_in``)."""
        aware = self.policy.traits.class_aware
        if held is not None and not aware:
            return  # one queue: nobody passes the held swapped request
        # P0 is never held back by the reservation: a P0-only admission needs no projection.
        projection = None if only_p0 and aware else self._reservations()
        skip: set[int] = set() if held is None else {held}  # classes the reservation holds back
        while plan.budget > 0:
            req = self.policy.peek(self._state(now, frozenset(skip)))
            if req is None or (only_p0 and req.priority != Priority.P0):
                break
            computed = self.kv.get_computed_blocks(req)
            if not self._reservation_fits(req, computed, projection):
                # Its predicted KV does not fit beside the running requests: its class waits,
                # the other classes may still be admitted (class-blind: everyone waits).
                if not self.policy.traits.class_aware:
                    break
                skip.add(int(req.priority))
                continue
            n = self._tokens_for(req, plan, computed.num_tokens)
            if n == 0:
                break  # the step has no time left for it
            seat = self._seats() > 0 or (cut_in and self._may_owe_seat(req))
            ids = self.kv.allocate_slots(req, n, computed) if seat else None
            if ids is None and not cut_in:
                short = self._shortfall(req, n, computed)
                if self._make_room(req, short, plan, seat=self._seats() <= 0):
                    ids = self.kv.allocate_slots(req, n, computed)
                seat = self._seats() > 0
            if ids is None or not seat:
                if ids is not None:  # memory came, the seat did not
                    self.kv.free(req.request_id)
                break  # head-of-line: the next request waits for this one
            self.policy.commit(req)
            self._dequeued(req)
            req.num_computed_tokens = computed.num_tokens
            req.transition(S.RUNNING)
            if req.first_scheduled_time is None:
                req.first_scheduled_time = now
                self.prompt_tokens_started += req.num_prompt_tokens
                self.prompt_tokens_cached += min(computed.num_tokens, req.num_prompt_tokens)
            self.running[req.request_id] = req
            plan.schedule(req, n, ids)
            self._served(req)
            if cut_in:
                self._owe_seat(req)
            self._reserved(req, projection)

    def _state(self, now: float, skip: frozenset[int] = frozenset()) -> SchedulerState:
        by_class = [0] * NUM_PRIORITIES
        for r in self.running.values():
            by_class[r.priority] += 1
        return SchedulerState(
            now=now,
            idle_seats=self._seats(),
            running_by_class=tuple(by_class),
            headroom_by_class=tuple(self.kv.headroom(p) for p in Priority),
            skip_classes=skip,
        )

    # -- results ---------------------------------------------------------------------------
    def update_from_output(self, out: SchedulerOutput, result: ExecutorOutput) -> list[Request]:
        """Advance computed tokens, append sampled tokens, apply stop conditions. Returns the
        requests that changed in this step (finished inside ``schedule()``, got a token,
        finished or failed), in scheduling order. Called after every ``schedule()``."""
        now = self.clock.now()
        if self._planned is not None:  # the step's measured time teaches the step-time model
            started, work, express = self._planned
            self.step_time.observe(work, now - started)
            self._express_time.add(now - started, express, now)
            self._planned = None
        failed = result.failed
        changed, self._changed = self._changed, []
        for rid, n in out.num_scheduled_tokens.items():
            req = self.running.get(rid)
            if req is None:
                continue  # aborted while the step ran
            if rid in failed:
                changed.append(self.finish(rid, S.FAILED, failed[rid]))
                continue
            drafts = len(out.spec_token_ids.get(rid, ()))
            req.num_computed_tokens += n - drafts  # accepted drafts count as they are taken
            self.kv.cache_blocks(req)  # (verified tokens only: the prefix cache never sees drafts)
            got, reason = take_output(req, result, now, self.config.max_model_len)
            if drafts and self.speculation is not None:
                accepted = len(result.accepted_token_ids.get(rid, ()))
                self.speculation.observe_request(req, drafts, accepted)
                self.kv.trim(req)
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
        self.calm.forget(request_id)
        if request_id in self.running:
            del self.running[request_id]
            self.seats_freed += 1
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
        self._learn(req)
        return req

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def make_stats(self, with_queue: bool = False) -> SchedulerStats:
        """The state as one frozen record (core/stats.py); `with_queue`: the predictor's view."""
        return scheduler_stats(self, with_queue)

    # -- invariants ---------------------------------------------------------------------------
    def check_invariants(self, out: SchedulerOutput | None = None) -> None:
        check_scheduler(self, out)
