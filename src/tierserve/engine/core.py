"""EngineCore: the step loop. ``step()`` is three calls:
``schedule()`` -> ``executor.execute(output)`` -> ``update_from_output()``.

Every step reports every request that changed in it, whatever else happened: a request finished
inside ``schedule()`` (alone and out of KV memory) comes back from ``update_from_output`` like
one that sampled its last token, and an output whose only news is a preemption or a finished id
still reaches the executor. There is no early return between the three calls.

An executor error fails the step's requests (their KV is freed) and the engine keeps serving the
others. A step that ran something records ``StepStats`` in ``last_stats`` (None otherwise): what
the step did, read from its output and timings, and the scheduler's record after it
(``Scheduler.make_stats``), not a difference of counters.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from tierserve.admission.load_meter import LoadMeter
from tierserve.clock import Clock
from tierserve.config import (
    FLAT_PARTITIONS,
    LRU_RETENTION,
    CacheConfig,
    PolicyConfig,
    PriorityConfig,
    SchedulerConfig,
)
from tierserve.core.kv import KVCacheManager
from tierserve.core.outputs import ExecutorOutput, SchedulerOutput
from tierserve.core.predict import LengthPredictor
from tierserve.core.scheduler import Scheduler
from tierserve.core.speculation import SpecStepStats, Speculation
from tierserve.core.stats import Preemption, SchedulerStats
from tierserve.executor.base import Executor, ExecutorLost
from tierserve.policies import create_policy
from tierserve.priority import Priority
from tierserve.request import Request, RequestStatus


@dataclass(frozen=True)
class StepStats:
    step: int
    time: float
    batch_size: int
    num_tokens: int
    num_prefill_tokens: int  # tokens of requests still catching up on known tokens
    num_decode_tokens: int
    schedule_s: float
    execute_s: float
    swapped_in_blocks: int
    swapped_out_blocks: int
    scheduler: SchedulerStats  # after the step
    spec: SpecStepStats | None = None  # drafts verified in the step (speculative decoding)
    cut_in: bool = False  # run between two layers of another step (core/cut_in.py)

    @property
    def preemptions(self) -> tuple[Preemption, ...]:
        """This step's preemptions."""
        return self.scheduler.preemptions

    @property
    def running(self) -> int:
        return self.scheduler.num_running

    @property
    def waiting(self) -> int:
        return self.scheduler.num_waiting

    @property
    def swapped(self) -> int:
        return self.scheduler.swapped

    @property
    def kv_usage(self) -> float:
        return self.scheduler.kv.usage


class EngineCore:
    def __init__(self, scheduler: Scheduler, executor: Executor, clock: Clock) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock
        self.last_stats: StepStats | None = None
        self.num_steps = 0
        self.num_failed_steps = 0
        self._layer_hook: Callable[[], None] | None = None  # set_layer_hook
        self._cutting_in = False
        # Rates for the TTFT predictor, measured on this engine's clock (admission/ttft.py).
        costs = scheduler.costs
        self.load_meter = LoadMeter(costs.prefill_tokens_per_s if costs else None)
        self.service_order = scheduler.policy.traits.service_order
        # A line of JSON per step (diagnostics: $TIERSERVE_STEP_TRACE names the file): what the
        # step-time model predicted for it and what it measured, with its shape.
        trace = os.environ.get("TIERSERVE_STEP_TRACE")
        self._trace = open(trace, "a", buffering=1) if trace else None  # noqa: SIM115

    @classmethod
    def build(
        cls,
        executor: Executor,
        clock: Clock,
        cache: CacheConfig,
        sched: SchedulerConfig | None = None,
        policy: PolicyConfig | None = None,
        priorities: PriorityConfig | None = None,
        speculation: Speculation | None = None,
        predictor: LengthPredictor | None = None,
    ) -> EngineCore:
        pol = create_policy(policy or PolicyConfig(), priorities)
        if not pol.traits.class_aware:  # a class-blind policy gets one shared pool: no floor, no
            # reserve, and LRU prefix-cache eviction whatever the class
            cache = replace(cache, partitions=FLAT_PARTITIONS, prefix_retention=LRU_RETENTION)
        kv = KVCacheManager(cache)
        scheduler = Scheduler(
            sched or SchedulerConfig(),
            kv,
            pol,
            clock,
            executor.preemption_costs(),
            speculation,
            predictor,
        )
        return cls(scheduler, executor, clock)

    # -- requests ----------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)
        meter, now = self.load_meter, self.clock.now()
        meter.on_add(request.base_priority, request.num_tokens, now, request.tenant)

    def abort_request(self, request_id: str, reason: str | None = None) -> Request | None:
        """Abort from any state; frees everything the request holds. None if unknown."""
        if request_id not in self.scheduler.requests:
            return None
        return self.scheduler.finish(request_id, RequestStatus.ABORTED, reason)

    def fail_request(self, request_id: str, reason: str) -> Request | None:
        if request_id not in self.scheduler.requests:
            return None
        return self.scheduler.finish(request_id, RequestStatus.FAILED, reason)

    def shed_lowest(self, below: Priority, reason: str) -> Request | None:
        """Fail the waiting request to shed first among classes less urgent than `below`
        (admission made room for a more urgent one). None if nobody waits there."""
        rid = self.scheduler.lowest_waiting(below)
        return None if rid is None else self.fail_request(rid, reason)

    def finish_request(self, request_id: str, reason: str = "stop") -> Request | None:
        """Finish a running request early (e.g. a stop string matched in the detokenizer)."""
        if request_id not in self.scheduler.running:
            return self.abort_request(request_id)
        return self.scheduler.finish(request_id, RequestStatus.FINISHED, reason)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step ------------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Run one step; return the requests that got a token, finished or failed in it.
        ``last_stats`` is set when the step ran anything (tokens or swaps), else None."""
        s = self.scheduler
        self.last_stats = None
        started = self.clock.now()
        t0 = time.perf_counter()
        out = s.schedule()
        t1 = time.perf_counter()
        planned = s.planned_seconds() if self._trace is not None else None
        result = ExecutorOutput() if out.is_empty else self._execute(out)
        t2 = time.perf_counter()
        changed = s.update_from_output(out, result)
        ran = out.total_num_scheduled_tokens or out.blocks_to_swap_in or out.blocks_to_swap_out
        if ran:
            self.last_stats = self._record(started, out, result, t1 - t0, t2 - t1)
            if self._trace is not None:
                self._write_trace(started, planned, self.last_stats)
        return changed

    def _write_trace(self, started: float, planned: float | None, st: StepStats) -> None:
        line = {
            "start": round(started, 6),
            "end": round(st.time, 6),
            "predicted_s": None if planned is None else round(planned, 6),
            "bound_s": self.scheduler.step_bound_s,
            "prefill_tokens": st.num_prefill_tokens,
            "decode_tokens": st.num_decode_tokens,
            "batch": st.batch_size,
            "waiting": st.waiting,
            "schedule_s": round(st.schedule_s, 6),
            "execute_s": round(st.execute_s, 6),
        }
        self._trace.write(json.dumps(line) + "\n")

    def _record(
        self, started: float, out, result, schedule_s: float, execute_s: float, cut_in=False
    ) -> StepStats:
        """Count a step that ran something; feed the load meter; return its stats."""
        self.num_steps += 1
        stats = self._stats(out, result, schedule_s, execute_s, cut_in)
        self.load_meter.on_step(
            started, self.clock.now(), stats.num_prefill_tokens, backlog=stats.waiting > 0
        )
        return stats

    def set_layer_hook(self, hook: Callable[[], None] | None) -> bool:
        """Have the executor call `hook` between two decoder layers of every step (where a
        ``cut_in`` may run). False when the executor has no layers to stop between."""
        setter = getattr(self.executor, "set_layer_hook", None)
        if setter is None:
            return False
        self._layer_hook = hook
        setter(None if hook is None else self._between_layers)
        return True

    def _between_layers(self) -> None:
        if not self._cutting_in and self._layer_hook is not None:  # not inside a cut-in's own
            self._layer_hook()

    def cut_in(self) -> tuple[list[Request], StepStats | None]:
        """Inside a step in flight (from the layer hook): run a step for the waiting P0
        requests (core/cut_in.py). Returns the requests that changed in it and its stats;
        nothing when no cut-in can run."""
        s = self.scheduler
        started = self.clock.now()
        t0 = time.perf_counter()
        out = s.schedule_cut_in()
        if out is None:
            return [], None
        t1 = time.perf_counter()
        self._cutting_in = True
        try:
            result = self._execute(out)
            t2 = time.perf_counter()
            changed = s.update_from_output(out, result)
        finally:
            self._cutting_in = False
            s.end_cut_in()
        return changed, self._record(started, out, result, t1 - t0, t2 - t1, cut_in=True)

    def check_executor(self) -> None:
        """Raise ExecutorLost when the executor can run no more steps (a tensor-parallel worker
        gone while the engine idled)."""
        lost = getattr(self.executor, "lost", None)
        if lost:
            raise ExecutorLost(lost)

    def _execute(self, out: SchedulerOutput) -> ExecutorOutput:
        try:
            return self.executor.execute(out)
        except ExecutorLost:
            raise  # nothing can run any more: the engine thread's crash path fails everyone
        except Exception as exc:  # the step's requests fail; everyone else keeps going
            self.num_failed_steps += 1
            return ExecutorOutput(
                failed={rid: f"executor error: {exc!r}" for rid in out.num_scheduled_tokens}
            )

    def _stats(self, out, result, schedule_s, execute_s, cut_in=False) -> StepStats:
        spec = out.spec_token_ids
        prefill = sum(
            n
            for rid, n in out.num_scheduled_tokens.items()
            if rid not in result.sampled_token_ids or (n > 1 and rid not in spec)
        )
        return StepStats(
            step=out.step_id,
            time=self.clock.now(),
            batch_size=len(out.num_scheduled_tokens),
            num_tokens=out.total_num_scheduled_tokens,
            num_prefill_tokens=prefill,
            num_decode_tokens=out.total_num_scheduled_tokens - prefill,
            schedule_s=schedule_s,
            execute_s=execute_s,
            swapped_in_blocks=len(out.blocks_to_swap_in),
            swapped_out_blocks=len(out.blocks_to_swap_out),
            scheduler=self.scheduler.make_stats(),
            spec=self.scheduler.speculation.take_step() if self.scheduler.speculation else None,
            cut_in=cut_in,
        )
