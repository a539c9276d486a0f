"""P0 cut-in: a step for newly arrived P0 requests, run between two decoder layers of the step
in flight.

The express step (scheduler.py) builds the next step for a waiting P0 request, but a P0 that
arrives mid-step still waits for the step in flight: under a flood of background decodes that
is most of its time to first token (a 24-stream decode step: ~140 ms on a 2-core AMD EPYC with
float32 products, where a cached P0 prompt takes ~50 ms). So the engine stops the step in
flight between two layers (its hidden states and the KV it wrote are kept), runs a step that
admits waiting P0 requests only, and then finishes the stopped step.

What makes it safe, with nothing in the stopped step touched:

- only *waiting* P0 requests are admitted: no running request is scheduled (their tokens of the
  stopped step are not known yet), and nobody is preempted or swapped (a victim's blocks may be
  read or written by the stopped step). A P0 that needs blocks held by others waits for the
  next normal step, as it would have. One that needs a seat takes it beyond `max_num_seqs`, as
  a debt: the next ``schedule()`` first preempts, for each such seat, a running request the
  policy lets it preempt (the victim the express step would have preempted before it), and a
  cut-in owes a seat only while such a victim exists for it (`_may_owe_seat`);
- a prefix hit can only be a block registered in the prefix cache, and blocks are registered
  after the step that computed them (``KVCacheManager.cache_blocks``), so no hit reads KV the
  stopped step is still writing;
- the stopped step's timing, which teaches the step-time model, leaves out the cut-in's time;
  the cut-in counts as express time, so P0 traffic cannot take more of the engine than express
  steps may (``SchedulerConfig.p0_express_min_gap``).

The caller (EngineCore.cut_in) runs ``schedule_cut_in()``, executes the output, passes the
result to ``update_from_output()`` as for any step, and then calls ``end_cut_in()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tierserve.core.outputs import SchedulerOutput
from tierserve.core.step_state import StepPlan
from tierserve.priority import Priority

if TYPE_CHECKING:
    from tierserve.clock import Clock
    from tierserve.config import SchedulerConfig
    from tierserve.core.kv import KVCacheManager
    from tierserve.core.step_time import StepBounds
    from tierserve.policies import Policy
    from tierserve.request import Request


class CutIn:
    config: SchedulerConfig
    policy: Policy
    clock: Clock
    kv: KVCacheManager
    running: dict[str, Request]
    step_preemptions: list
    _bounds: StepBounds

    def _init_cut_in(self) -> None:
        self.cut_ins = 0  # cut-in steps run since the start
        # The stopped step's record while a cut-in runs: (timing, start of the cut-in, its
        # preemptions, reported with its own stats)
        self._stopped: tuple[tuple | None, float, list] | None = None
        self.seats_owed: list[str] = []  # P0 requests a cut-in seated beyond max_num_seqs

    def wants_cut_in(self) -> bool:
        """A P0 request waits and a cut-in may run now (cheap: read between layers)."""
        cfg = self.config
        if not cfg.p0_cut_in or cfg.p0_express == "off" or not self.policy.traits.p0_strict:
            return False
        if self._waiting_count[Priority.P0] == 0 or self._stopped is not None:
            return False
        if self.p0_prompt_in_flight:  # its first token would wait for the cut-in's prompts:
            return False  # the new P0 waits for the step instead (bounded while P0 is about)
        share = self._express_time.share(self.clock.now())
        return share < 1.0 / (1 + cfg.p0_express_min_gap)

    def schedule_cut_in(self) -> SchedulerOutput | None:
        """The cut-in step (see the module's docstring), or None when no waiting P0 request can
        be admitted without touching the step in flight."""
        if not self.wants_cut_in():
            return None
        now = self.clock.now()
        plan = StepPlan(
            self._step,
            self.config.max_num_batched_tokens,
            self.step_time.coefficients,
            # The bound while P0 is about: one P0's prompt is never cut, but a burst of them is
            # taken as many as fit, the rest in the next steps (each step's first tokens go
            # out at its end: one unbounded cut-in would hold them all until the last prompt)
            self._bounds.p0_about,
            self.kv.block_size,
        )
        self._admit_waiting(plan, now, only_p0=True, cut_in=True)
        if not plan.tokens:
            return None
        self._step += 1
        self._stopped = (self._planned, now, self.step_preemptions)
        self._planned = (now, plan.total_work(), True)
        self.step_preemptions = []  # a cut-in preempts nobody
        self.cut_ins += 1
        self.express_steps += 1
        out = plan.build(self.running, self.kv, self._known)
        if self.config.check_invariants:
            self.check_invariants(out)
        return out

    def _may_owe_seat(self, req: Request) -> bool:
        """A cut-in may seat `req` beyond `max_num_seqs`: a running request is left for the
        next step to preempt for each seat owed, this one included."""
        may = self.policy.may_preempt
        victims = sum(1 for r in self.running.values() if may(req, r))
        return victims > len(self.seats_owed)

    def _owe_seat(self, req: Request) -> None:
        if len(self.running) > self.config.max_num_seqs:
            self.seats_owed.append(req.request_id)

    def _repay_seats(self, plan: StepPlan) -> None:
        """At the start of a step: preempt a victim for each seat a cut-in took beyond
        `max_num_seqs` (the policy chooses, as for any seat a P0 needs)."""
        owed, self.seats_owed = self.seats_owed, []
        for rid in owed:
            req = self.running.get(rid)
            if len(self.running) <= self.config.max_num_seqs:
                break
            if req is not None:
                self._make_room(req, 0, plan, seat=True)

    def end_cut_in(self) -> None:
        """After the cut-in's ``update_from_output``: the stopped step's record again, its start
        moved by the cut-in's time (so its measured time is its own)."""
        if self._stopped is None:
            raise RuntimeError("end_cut_in without a cut-in")
        planned, since, self.step_preemptions = self._stopped
        self._stopped = None
        self._planned = None
        if planned is not None:
            started, work, express = planned
            self._planned = (started + self.clock.now() - since, work, express)
