"""EngineCore: the step loop. ``step()`` is three calls:
``schedule()`` -> ``executor.execute(output)`` -> ``update_from_output()``.

An executor error fails the step's requests (their KV is freed) and the engine keeps serving the
others. Every step records ``StepStats``; observers (metrics, simulator) subscribe with
``add_step_listener``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from tierserve.clock import Clock
from tierserve.config import CacheConfig, PolicyConfig, PriorityConfig, SchedulerConfig
from tierserve.core.kv import KVCacheManager
from tierserve.core.outputs import ExecutorOutput
from tierserve.core.scheduler import Scheduler
from tierserve.executor.base import Executor
from tierserve.policies import create_policy
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
    preempted_swap: int
    preempted_recompute: int
    swapped_in_blocks: int
    swapped_out_blocks: int
    running: int
    waiting: int
    swapped: int
    kv_usage: float
    # (victim's submitted class, "swap" | "recompute") for each preemption in this step.
    preemptions: tuple = ()


class EngineCore:
    def __init__(self, scheduler: Scheduler, executor: Executor, clock: Clock) -> None:
        self.scheduler = scheduler
        self.executor = executor
        self.clock = clock
        self.last_stats: StepStats | None = None
        self._listeners: list[Callable[[StepStats, list[Request]], None]] = []
        self.num_steps = 0
        self.num_failed_steps = 0

    @classmethod
    def build(
        cls,
        executor: Executor,
        clock: Clock,
        cache: CacheConfig,
        sched: SchedulerConfig | None = None,
        policy: PolicyConfig | None = None,
        priorities: PriorityConfig | None = None,
    ) -> EngineCore:
        kv = KVCacheManager(cache)
        pol = create_policy(policy or PolicyConfig(), priorities)
        scheduler = Scheduler(
            sched or SchedulerConfig(), kv, pol, clock, executor.preemption_costs()
        )
        return cls(scheduler, executor, clock)

    def add_step_listener(self, fn: Callable[[StepStats, list[Request]], None]) -> None:
        self._listeners.append(fn)

    # -- requests ----------------------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_request(self, request_id: str, reason: str | None = None) -> Request | None:
        """Abort from any state; frees everything the request holds. None if unknown."""
        if request_id not in self.scheduler.requests:
            return None
        return self.scheduler.finish(request_id, RequestStatus.ABORTED, reason)

    def fail_request(self, request_id: str, reason: str) -> Request | None:
        if request_id not in self.scheduler.requests:
            return None
        return self.scheduler.finish(request_id, RequestStatus.FAILED, reason)

    def finish_request(self, request_id: str, reason: str = "stop") -> Request | None:
        """Finish a running request early (e.g. a stop string matched in the detokenizer)."""
        if request_id not in self.scheduler.running:
            return self.abort_request(request_id)
        return self.scheduler.finish(request_id, RequestStatus.FINISHED, reason)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step ------------------------------------------------------------------------------
    def step(self) -> list[Request]:
        """Run one step; return the requests that got a token, finished or failed."""
        s = self.scheduler
        before = s.preemptions
        swap0, rec0 = before.swap, before.recompute
        in0, out0 = before.swapped_in_blocks, before.swapped_out_blocks
        s.preemption_events.clear()
        t0 = time.perf_counter()
        out = s.schedule()
        t1 = time.perf_counter()
        if out.is_empty and not out.finished_req_ids:
            return []
        try:
            result = self.executor.execute(out)
        except Exception as exc:  # the step's requests fail; everyone else keeps going
            self.num_failed_steps += 1
            result = ExecutorOutput(
                failed={rid: f"executor error: {exc!r}" for rid in out.num_scheduled_tokens}
            )
        t2 = time.perf_counter()
        prefill = sum(
            n
            for rid, n in out.num_scheduled_tokens.items()
            if rid not in result.sampled_token_ids or n > 1
        )
        changed = s.update_from_output(
            out, result.sampled_token_ids, result.logprobs, result.failed
        )
        p = s.preemptions
        self.num_steps += 1
        self.last_stats = StepStats(
            step=out.step_id,
            time=self.clock.now(),
            batch_size=len(out.num_scheduled_tokens),
            num_tokens=out.total_num_scheduled_tokens,
            num_prefill_tokens=prefill,
            num_decode_tokens=out.total_num_scheduled_tokens - prefill,
            schedule_s=t1 - t0,
            execute_s=t2 - t1,
            preempted_swap=p.swap - swap0,
            preempted_recompute=p.recompute - rec0,
            swapped_in_blocks=p.swapped_in_blocks - in0,
            swapped_out_blocks=p.swapped_out_blocks - out0,
            running=len(s.running),
            waiting=s.num_waiting,
            swapped=len(s.swapped),
            kv_usage=s.kv.usage(),
            preemptions=tuple(s.preemption_events),
        )
        for fn in self._listeners:
            fn(self.last_stats, changed)
        return changed
